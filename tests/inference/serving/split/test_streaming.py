"""Answers from a real inference worker process, through SplitClient over real Redis."""

import asyncio

import pytest

from inference.engine import GenerationRequest, SamplingParams
from inference.serving import split_protocol as protocol
from tests.split.streams import collect, counting, eventually, short, tokens

pytestmark = [pytest.mark.redis, pytest.mark.model]


def _models(split_client) -> dict:
    snapshots = split_client.snapshots()
    return snapshots[0]["models"] if snapshots else {}


def _idle(split_client) -> bool:
    models = _models(split_client)
    return bool(models) and all(
        m["active_sequences"] == 0 and m["queue_depth"] == 0 for m in models.values()
    )


async def test_a_real_answer_streams_from_the_worker_token_by_token(
    split_client, spec, shared_worker
):
    events = await collect(split_client, short(), spec)

    kinds = [e["type"] for e in events]
    assert "claimed" not in kinds  # the client's own bookkeeping stays inside
    assert "phase" in kinds and kinds.index("phase") < kinds.index("token")
    assert len(tokens(events)) >= 2
    done = events[-1]
    assert done["type"] == "done"
    assert done["finish_reason"] in ("stop", "length")
    assert done["text"] == "".join(e["text"] for e in tokens(events))
    figures = done["figures"]
    assert figures["prompt_tokens"] > 0
    assert figures["output_tokens"] == len(tokens(events))
    for key in ("ttft", "prefill_time", "prompt_tps", "decode_tps", "queue_time", "itl"):
        assert figures[key] is not None, key
    assert [p["phase"] for p in figures["timeline"]][-1] == "decode"


async def test_log_probabilities_come_from_the_worker_as_the_engine_made_them(
    split_client, spec, shared_worker
):
    asked = GenerationRequest(short().prompt, SamplingParams(max_tokens=6, temperature=0.0,
                                                             logprobs=3),
                              model="smollm2-135m-instruct")  # fmt: skip
    events = tokens(await collect(split_client, asked, spec))
    assert events
    for event in events:
        chosen, top = event["logprobs"]["chosen"], event["logprobs"]["top"]
        assert chosen["token_id"] == event["token_id"] == top[0]["token_id"]
        assert bytes(chosen["piece"]) == event["text"].encode()  # bytes survive Redis
        assert len(top) == 3 and all(t["logprob"] <= 0.0 for t in top)


async def test_two_concurrent_streams_both_complete(split_client, spec, shared_worker):
    first, second = await asyncio.gather(
        collect(split_client, short("Name a colour."), spec),
        collect(split_client, short("Name a fruit."), spec),
    )
    for events in (first, second):
        assert events[-1]["type"] == "done", events[-1]
        assert tokens(events)
    assert first[-1]["request_id"] != second[-1]["request_id"]


async def test_a_cancel_mid_stream_ends_with_cancelled_and_frees_the_sequence(
    split_client, spec, shared_worker
):
    generation = counting()

    async def cancel_after_three_tokens(event, events):
        if event["type"] == "token" and len(tokens(events)) == 3:
            await split_client.cancel(generation.request_id)

    events = await collect(split_client, generation, spec, on_event=cancel_after_three_tokens)

    done = events[-1]
    assert done["type"] == "done"
    assert done["finish_reason"] == "cancelled"
    assert 3 <= done["figures"]["output_tokens"] < 300
    assert await eventually(lambda: _idle(split_client))


async def test_leaving_the_loop_early_cancels_the_generation(split_client, spec, shared_worker):
    generation = counting()
    seen = 0
    stream = split_client.stream(generation, spec)
    async with asyncio.timeout(180):
        async for event in stream:
            seen += event["type"] == "token"
            if seen == 2:
                break
    await stream.aclose()

    assert await eventually(lambda: _idle(split_client))
    closed = protocol.closed_key(generation.request_id)
    assert await eventually(lambda: split_client.redis.exists(closed))


async def test_snapshots_show_the_worker_with_the_model_loaded(split_client, spec, shared_worker):
    await collect(split_client, short(), spec)

    assert await eventually(lambda: spec.name in _models(split_client))
    (snapshot,) = split_client.snapshots()
    assert snapshot["worker"] == shared_worker.name
    assert snapshot["mode"] == "split"
    assert [row["name"] for row in snapshot["loaded"]] == [spec.name]
    assert snapshot["models"][spec.name]["slots"] >= 1
    assert "rss_bytes" in snapshot["system"]
    assert split_client.live_workers() == [shared_worker.name]


async def test_unload_and_load_reach_the_worker(split_client, spec, shared_worker):
    await collect(split_client, short(), spec)

    assert await split_client.unload(spec.name) is True
    assert await eventually(lambda: spec.name not in _models(split_client))
    assert await split_client.unload(spec.name) is False  # nothing left to unload

    await split_client.load(spec)
    assert await eventually(lambda: spec.name in _models(split_client))


async def test_a_load_the_worker_cannot_do_raises_with_its_reason(
    split_client, spec, shared_worker, tmp_path
):
    from dataclasses import replace

    from inference.serving.split_client import WorkerError

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    bad = replace(spec, name="broken", config=replace(spec.config, model_path=str(broken)))

    with pytest.raises(WorkerError, match=shared_worker.name):
        await split_client.load(bad)


async def test_invalid_sampling_params_come_back_as_an_invalid_error(
    split_client, spec, shared_worker, monkeypatch
):
    # Only a payload changed on its way can carry them: the web side cannot build such a request.
    generation = GenerationRequest("Hi", SamplingParams(), model=spec.name)
    wire = generation.to_wire()
    monkeypatch.setattr(GenerationRequest, "to_wire",
                        lambda self: {**wire, "params": {**wire["params"], "temperature": -1}})

    (event,) = await collect(split_client, generation, spec)

    assert event["type"] == "error"
    assert event["code"] == "invalid"
    assert event["field"] == "temperature"


async def test_a_redelivered_request_that_had_started_is_not_run_twice(
    split_client, spec, shared_worker
):
    # What a redelivery after a worker's death looks like to the next worker: the first token
    # of this request id already went out once.
    generation = short()
    split_client.redis.set(protocol.started_key(generation.request_id), "a-dead-worker", ex=60)

    (event,) = await collect(split_client, generation, spec)

    assert event["type"] == "error"
    assert "not run twice" in event["message"]


async def test_a_request_the_client_gave_up_on_is_not_run(split_client, spec, shared_worker):
    generation = short()
    split_client.redis.set(protocol.closed_key(generation.request_id), "client", ex=60)

    (event,) = await collect(split_client, generation, spec)

    assert event["type"] == "done"
    assert event["finish_reason"] == "cancelled"
    assert event["figures"] == {}


# --- what the dashboard reads in split mode ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_staff_dashboard_socket_gets_the_workers_telemetry(
    split_client, shared_worker, admin_user
):
    from tests.dashboard.web.sockets import open_socket

    ws, connected, _ = await open_socket("/ws/telemetry/", admin_user)
    assert connected
    frame = await ws.receive_json_from(timeout=60)
    await ws.disconnect()

    assert frame["type"] == "snapshot"
    assert frame["panels"]["worker"] == shared_worker.name
    assert frame["panels"]["mode"] == "split"


def test_healthz_reports_the_split_mode_worker(split_client, shared_worker, client):
    response = client.get("/healthz")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["mode"], body["broker"], body["worker"]) == ("split", "ok", "ok")
