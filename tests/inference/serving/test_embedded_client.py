"""The embedded inference client: events as dicts, refusals as error events, early exits cancel."""

import asyncio

import pytest

from inference.engine import GenerationRequest, InvalidParams, RefusalKind, SamplingParams
from inference.engine.host import EngineHost
from inference.serving.client import EmbeddedClient
from tests.inference.engine.fakes import engines_on, wait_until
from tests.inference.engine.test_host import Factory, spec


def make_client(load_s: float = 0.0) -> tuple[EmbeddedClient, Factory]:
    factory = Factory(load_s=load_s)
    return EmbeddedClient(EngineHost(engines_on(factory), max_loaded=1)), factory


async def test_a_stream_yields_event_dicts_ending_with_done():
    client, _ = make_client()
    try:
        generation = GenerationRequest("hello", SamplingParams(max_tokens=4), model="m")
        events = [e async for e in client.stream(generation, spec("m"))]
        assert [e["type"] for e in events][-1] == "done"
        assert sum(e["type"] == "token" for e in events) == 4
        assert events[-1]["figures"]["output_tokens"] == 4
    finally:
        client.host.shutdown()


def test_bad_params_are_refused_where_the_request_is_built_naming_the_field():
    with pytest.raises(InvalidParams) as refused:
        GenerationRequest("hello", SamplingParams(temperature=-2), model="m")
    assert refused.value.kind == RefusalKind.INVALID and refused.value.field == "temperature"


async def test_a_refusal_in_the_engine_comes_back_as_one_error_event_of_its_kind():
    client, factory = make_client()
    try:
        too_long = GenerationRequest("x" * 5000, SamplingParams(max_tokens=2), model="m")
        events = [e async for e in client.stream(too_long, spec("m"))]
        assert [e["type"] for e in events] == ["error"]
        assert events[0]["code"] == RefusalKind.TOO_LONG == "too_long"
    finally:
        client.host.shutdown()


async def test_leaving_while_the_model_loads_cancels_the_request_once_it_exists():
    client, factory = make_client(load_s=0.5)
    try:
        generation = GenerationRequest("hello", SamplingParams(max_tokens=200), model="m")

        async def listen() -> None:
            async for _ in client.stream(generation, spec("m", overhead=0.01)):
                pass

        task = asyncio.create_task(listen())
        await asyncio.sleep(0.1)  # inside the load
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # The runner is built before its engine is recorded as loaded: wait for the host.
        assert await asyncio.to_thread(wait_until, lambda: client.host.get("m"), 5.0)
        engine = client.host.get("m")
        assert await asyncio.to_thread(wait_until, lambda: not engine.busy, 5.0)
        runner = factory.built["m"][0]
        assert generation.request_id in runner.released
        assert engine.snapshot()["outcomes"]["cancelled"] == 1
    finally:
        client.host.shutdown()


async def test_a_request_that_waits_for_its_model_to_load_is_told_so_first():
    client, _ = make_client(load_s=0.8)
    try:
        generation = GenerationRequest("hello", SamplingParams(max_tokens=2), model="m")
        events = [e async for e in client.stream(generation, spec("m"))]
        assert events[0] == {"type": "phase", "phase": "loading",
                             "request_id": generation.request_id, "model": "m"}  # fmt: skip
        assert [e.get("phase") for e in events[1:3]] == ["waiting", "prefilling"]
        assert events[-1]["type"] == "done"
        # Warm now: no loading event.
        again = GenerationRequest("hello", SamplingParams(max_tokens=2), model="m")
        kinds = [e.get("phase") async for e in client.stream(again, spec("m"))]
        assert "loading" not in kinds
    finally:
        client.host.shutdown()


async def test_a_refusal_after_a_load_still_comes_as_one_error_event_after_the_loading_one():
    client, _ = make_client(load_s=0.8)
    try:
        generation = GenerationRequest("x" * 300, SamplingParams(max_tokens=2), model="m")
        events = [e async for e in client.stream(generation, spec("m"))]
        assert [e["type"] for e in events] == ["phase", "error"]
        assert events[0]["phase"] == "loading" and events[1]["code"] == "too_long"
    finally:
        client.host.shutdown()


async def test_set_priority_reaches_the_engine_holding_the_request_and_ignores_others():
    client, _ = make_client()
    try:
        generation = GenerationRequest("hello", SamplingParams(max_tokens=400), model="m")
        stream = client.stream(generation, spec("m", overhead=0.01))
        assert (await anext(stream))["type"] in ("phase", "progress")  # the engine has it

        def priorities() -> list[str]:
            return [row["priority"] for row in client.host.get("m").snapshot()["streams"]]

        await client.set_priority(generation.request_id, "background")
        assert await asyncio.to_thread(wait_until, lambda: priorities() == ["background"])
        await client.set_priority("not-running-here", "interactive")  # nothing to change
        await client.set_priority(generation.request_id, "interactive")
        assert await asyncio.to_thread(wait_until, lambda: priorities() == ["interactive"])
        await stream.aclose()
    finally:
        client.host.shutdown()
