"""What a waiting person is told: queue positions (in fair-share order), prefill progress per
chunk, a pause, and the step telemetry the dashboard draws (the fake runner in place of
llama.cpp)."""

import pytest

from inference.engine.events import (
    PausedEvent,
    PhaseEvent,
    PrefillEvent,
    QueueEvent,
    TokenEvent,
    event_to_dict,
)
from inference.engine.params import SamplingParams
from tests.inference.engine.fakes import ask

from .fakes import FakeRunner, alone_output, wait_until

TIMEOUT = 10.0


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def of_type(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def prompt_chunks(fake: FakeRunner, request_id: str, prompt_len: int) -> list[int]:
    """The sizes of the prompt chunks the fake ran for a request (not its decodes)."""
    return [n for _, _, start, n, _ in fake.chunks_of(request_id) if start < prompt_len]


def test_queued_requests_hear_their_place_each_time_it_changes(make_engine):
    fake = FakeRunner(n_slots=1, overhead=0.002)
    engine, fake = make_engine(fake)
    running = engine.submit(ask("first", greedy(15)))
    assert wait_until(lambda: fake.chunks_of(running.id))
    second, third = engine.submit(ask("second", greedy(3))), engine.submit(ask("third", greedy(3)))

    third_events = list(third.events(timeout=TIMEOUT))
    second_events = list(second.events(timeout=TIMEOUT))
    assert [e.ahead for e in of_type(second_events, QueueEvent)] == [0]
    assert [e.ahead for e in of_type(third_events, QueueEvent)] == [1, 0]
    # Told while waiting, before the prompt is read.
    kinds = [(e.type, getattr(e, "phase", None)) for e in third_events]
    assert kinds.index(("progress", "waiting")) < kinds.index(("phase", "prefilling"))
    assert running.result(TIMEOUT).finish_reason == "length"


def test_a_request_admitted_at_once_is_not_told_a_queue_position(make_engine):
    engine, _ = make_engine()
    events = list(engine.submit(ask("hello", greedy(2))).events(timeout=TIMEOUT))
    assert of_type(events, QueueEvent) == []


def test_a_long_prompt_reports_its_progress_after_every_chunk_beside_a_stream(make_engine):
    fake = FakeRunner(n_batch=16, ctx_per_seq=512, overhead=0.001)
    engine, fake = make_engine(fake)
    stream = engine.submit(ask("s", greedy(200)))
    assert wait_until(lambda: len(fake.chunks_of(stream.id)) >= 3)  # it is decoding
    prompt = "p" * 100
    events = list(engine.submit(ask(prompt, greedy(2), request_id="long")).events(timeout=TIMEOUT))

    progress = of_type(events, PrefillEvent)
    chunks = prompt_chunks(fake, "long", len(prompt))
    assert len(chunks) >= 7  # 16-token steps, one token of each given to the stream
    # One event at admission (nothing read yet), then one per chunk: not one per token.
    assert len(progress) == 1 + len(chunks)
    assert [e.done for e in progress] == [0, *[sum(chunks[: i + 1]) for i in range(len(chunks))]]
    assert {(e.total, e.cached) for e in progress} == {(100, 0)}
    # All of them before the first token, after the "prefilling" phase.
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
    prefilling = next(i for i, e in enumerate(events)
                      if isinstance(e, PhaseEvent) and e.phase == "prefilling")  # fmt: skip
    assert all(prefilling < events.index(e) < first_token for e in progress)
    stream.cancel()


def test_a_cached_prefix_counts_as_read_from_the_first_progress_event(make_engine):
    engine, _ = make_engine(FakeRunner(n_batch=16, ctx_per_seq=512))
    first = "Tell me about the sea. " * 3
    engine.submit(ask(first, greedy(4), cache_key="c")).result(TIMEOUT)
    done = engine.submit(ask(first + "And rivers?", greedy(4), cache_key="c"))
    events = list(done.events(timeout=TIMEOUT))
    progress = of_type(events, PrefillEvent)
    cached = events[-1].figures["cached_tokens"]
    assert cached > 0
    assert progress[0].done == progress[0].cached == cached
    assert progress[-1].done == progress[-1].total == len(first + "And rivers?")


def test_progress_events_have_the_shapes_the_pages_read(make_engine):
    assert event_to_dict(QueueEvent("r", 2)) == {
        "type": "progress", "request_id": "r", "phase": "waiting", "ahead": 2,
    }  # fmt: skip
    assert event_to_dict(PrefillEvent("r", 640, 1819, 100)) == {
        "type": "progress", "request_id": "r", "phase": "prefilling",
        "done": 640, "total": 1819, "cached": 100,
    }  # fmt: skip


def test_the_snapshot_shows_steps_that_carried_a_prompt_beside_a_decode(make_engine):
    fake = FakeRunner(n_batch=16, ctx_per_seq=512, overhead=0.001)
    engine, fake = make_engine(fake, itl_target=0.5)
    stream = engine.submit(ask("s", greedy(300)))
    assert wait_until(lambda: len(fake.chunks_of(stream.id)) >= 3)
    engine.submit(ask("q" * 120, greedy(2))).result(TIMEOUT)
    snap = engine.snapshot()

    steps = snap["steps"]
    assert set(steps) == {"ago", "decode", "prompt", "ms", "seqs",
                          "background", "interactive", "paused", "verify",
                          "output", "image", "encoding", "save_ms",
                          "restore_ms", "target_ms", "predicted_ms"}  # fmt: skip
    assert len({len(column) for column in steps.values()}) == 1
    mixed = [(d, p) for d, p in zip(steps["decode"], steps["prompt"], strict=True) if d and p]
    assert len(mixed) >= 7  # the 120-token prompt went in beside the stream's token
    # An interactive stream: every step that decoded was bound by the ITL target.
    assert steps["interactive"] == [d > 0 for d in steps["decode"]]
    # ...and says so in its record: the ITL target where a stream decoded, none where not.
    assert steps["target_ms"] == [500.0 if d else 0.0 for d in steps["decode"]]
    assert set(steps["background"]) == set(steps["paused"]) == set(steps["verify"]) == {0}
    assert all(p + d <= 16 for d, p in mixed)  # never more than the batch
    assert steps["ago"] == sorted(steps["ago"], reverse=True)  # oldest first
    assert all(ms > 0 for ms in steps["ms"])

    (row,) = snap["streams"]  # the stream, still decoding
    assert row["phase"] == "decoding" and row["output_tokens"] > 0
    assert wait_until(lambda: (engine.snapshot()["streams"][0]["tps"] or 0) > 0)

    window = snap["windows"]["30"]
    assert window["prompt_tps"] > 0 and window["output_tps"] > 0
    assert window["itl"]["count"] > 0 and window["ttft"]["count"] == 2
    assert len(window["series"]["output_tps"]) == 30
    assert snap["now"]["output_tps"] > 0
    stream.cancel()


@pytest.mark.parametrize("n_steps", [0, 1000])
def test_the_step_columns_stay_bounded(make_engine, n_steps):
    engine, _ = make_engine(FakeRunner(ctx_per_seq=1024, n_ctx=2048))
    if n_steps:
        engine.submit(ask("x", greedy(n_steps))).result(TIMEOUT)
    steps = engine.snapshot()["steps"]
    assert len(steps["ago"]) == min(n_steps, 300)
    assert engine.snapshot()["streams"] == []  # nothing runs: no stream rows


def test_a_person_arriving_behind_an_apps_backlog_is_told_it_is_next(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=1, overhead=0.002))
    running = engine.submit(ask("running", greedy(2000), share="apikey:3"))
    assert wait_until(lambda: fake.chunks_of(running.id))
    backlog = [engine.submit(ask(f"doc {i}", greedy(2), share="apikey:3")) for i in range(5)]
    assert wait_until(lambda: engine.snapshot()["queue_depth"] == 5)
    person = engine.submit(ask("hello", greedy(2), share="user:5"))
    assert wait_until(lambda: engine.snapshot()["queue_depth"] == 6)
    running.cancel()
    person_events = list(person.events(timeout=TIMEOUT))
    assert [e.ahead for e in of_type(person_events, QueueEvent)] == [0]
    last_doc = list(backlog[-1].events(timeout=TIMEOUT))
    # Told 4 ahead, then 5 when the person went before it, then counting down.
    assert [e.ahead for e in of_type(last_doc, QueueEvent)][:2] == [4, 5]


def test_a_background_prompt_is_told_it_is_paused_while_a_persons_prompt_is_read(make_engine):
    fake = FakeRunner(n_batch=16, ctx_per_seq=2048, n_ctx=4096, overhead=0.002)
    engine, fake = make_engine(fake)
    document = "b" * 1000  # 63 steps of 16 tokens
    batch = engine.submit(ask(document, greedy(5), priority="background", share="apikey:3"))
    assert wait_until(lambda: len(fake.chunks_of(batch.id)) >= 2)
    person = engine.submit(ask("p" * 100, greedy(5), share="user:5"))
    assert person.result(TIMEOUT).text == alone_output("p" * 100, 5)
    events = list(batch.events(timeout=TIMEOUT))

    paused = of_type(events, PausedEvent)
    assert len(paused) == 1  # once, however many steps it waited
    assert event_to_dict(paused[0]) == {"type": "progress", "request_id": batch.id,
                                        "phase": "paused"}  # fmt: skip
    # It was told before its prefill went on, and it resumed where it was.
    after = events[events.index(paused[0]) + 1 :]
    before = of_type(events[: events.index(paused[0])], PrefillEvent)
    assert of_type(after, PrefillEvent)[0].done > before[-1].done
    assert events[-1].text == alone_output(document, 5)
    # No step read the person's prompt and the document's together.
    lengths = {person.id: 100, batch.id: len(document)}
    for step in fake.steps:
        reading = {rid for rid, _, start, _, _ in step if start < lengths.get(rid, 0)}
        assert reading != {person.id, batch.id}
