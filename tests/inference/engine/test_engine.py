"""The engine loop on a real thread, with the fake runner in place of llama.cpp."""


import asyncio
import threading
import time

import pytest

from inference.engine.engine import Engine, EngineStopped, PromptTooLong
from inference.engine.events import DoneEvent, ErrorEvent, PhaseEvent, TokenEvent
from inference.engine.params import SamplingParams
from inference.engine.prefix_cache import KvTrim
from inference.engine.scheduler import QueueFull

from .fakes import (
    EOG,
    FakeRunner,
    alone_output,
    ask,
    byte_tokens,
    char_tokens,
    wait_until,
    wall_of,
)

TIMEOUT = 10.0


def collect(handle, timeout: float = TIMEOUT) -> list:
    return list(handle.events(timeout=timeout))


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def tokens_of(events: list) -> list[TokenEvent]:
    return [e for e in events if isinstance(e, TokenEvent)]


def assert_all_freed(engine, fake: FakeRunner) -> None:
    """Nothing running, no sampler alive, no KV held (the prefix cache aside, when asked)."""
    assert wait_until(lambda: not engine.busy and engine.snapshot()["kv_reserved"] == 0)
    snap = engine.snapshot()
    assert snap["active_sequences"] == 0 and snap["queue_depth"] == 0
    assert fake.samplers == set()


# --- one request -----------------------------------------------------------------------------


def test_a_request_streams_its_phases_then_its_tokens_then_done(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.001))
    events = collect(engine.submit(ask("Hello there", greedy(5))))
    kinds = [(e.type, getattr(e, "phase", None)) for e in events]
    assert kinds == [
        ("phase", "waiting"), ("phase", "prefilling"),
        ("progress", "prefilling"), ("progress", "prefilling"),  # 0 of 11 read, then 11 of 11
        ("phase", "decoding"),
        *[("token", None)] * 5,
        ("done", None),
    ]  # fmt: skip
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.finish_reason == "length"
    assert done.text == "".join(e.text for e in tokens_of(events)) == alone_output("Hello there", 5)
    assert [e.index for e in tokens_of(events)] == [0, 1, 2, 3, 4]


def test_the_figures_are_consistent(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.002))
    done = engine.submit(ask("Hello there", greedy(6))).result(timeout=TIMEOUT)
    f = done.figures
    assert f["finish_reason"] == "length"
    assert f["prompt_tokens"] == 11
    assert f["output_tokens"] == 6
    assert f["cached_tokens"] == 0
    assert f["load_time"] == 0.0
    assert f["queue_time"] >= 0.0
    assert 0 < f["prefill_time"] <= f["ttft"] <= f["total_time"]
    assert f["prompt_tps"] > 0
    assert f["decode_tps"] > 0
    assert f["itl"]["p50"] > 0 and f["itl"]["max"] >= f["itl"]["p95"] >= f["itl"]["p50"]
    phases = [span["phase"] for span in f["timeline"]]
    assert phases == ["queue", "prefill", "decode"]
    assert f["timeline"][1]["tokens"] == 11


def test_the_figures_charge_the_load_time_given_at_submit(make_engine):
    engine, _ = make_engine()
    accepted = time.perf_counter() - 0.5  # accepted before a half-second load
    asked = ask("hi", greedy(2), arrived_wall=wall_of(accepted))
    done = engine.submit(asked, load_time=0.5).result(TIMEOUT)
    f = done.figures
    assert f["load_time"] == 0.5
    assert 0 <= f["queue_time"] < 0.5
    assert f["ttft"] >= 0.5
    assert f["timeline"][0] == {"phase": "load", "start": 0.0, "end": 0.5}


def test_an_end_of_generation_token_finishes_with_stop(make_engine):
    engine, fake = make_engine()
    fake.scripts["r"] = char_tokens("ok") + [EOG]
    done = engine.submit(ask("hi", greedy(50), request_id="r")).result(timeout=TIMEOUT)
    assert (done.finish_reason, done.text) == ("stop", "ok")
    assert done.figures["output_tokens"] == 2


def test_a_stop_string_ends_the_answer_and_is_never_streamed(make_engine):
    engine, fake = make_engine()
    fake.scripts["r"] = char_tokens("Yes.\nUser: more")
    events = collect(engine.submit(ask("hi", greedy(50, stop=["\nUser:"]), request_id="r")))
    streamed = "".join(e.text for e in tokens_of(events))
    assert streamed == "Yes."
    assert events[-1].finish_reason == "stop"
    assert events[-1].text == "Yes."


def test_held_back_text_is_sent_when_the_answer_ends_without_a_stop(make_engine):
    engine, fake = make_engine()
    fake.scripts["r"] = char_tokens("ab\nUs")
    events = collect(engine.submit(ask("hi", greedy(5, stop=["\nUser:"]), request_id="r")))
    assert "".join(e.text for e in tokens_of(events)) == "ab\nUs"
    assert events[-1].finish_reason == "length"
    assert events[-1].text == "ab\nUs"


def test_a_character_split_over_two_tokens_is_streamed_whole(make_engine):
    engine, fake = make_engine()
    fake.scripts["r"] = byte_tokens("café")
    events = collect(engine.submit(ask("hi", greedy(5), request_id="r")))
    assert [e.text for e in tokens_of(events)] == ["c", "a", "f", "", "é"]
    assert events[-1].text == "café"


def decode_start(figures: dict) -> float:
    return next(span["start"] for span in figures["timeline"] if span["phase"] == "decode")


def test_the_ttft_is_the_first_text_sent_not_the_first_token_sampled(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.001))
    fake.scripts["plain"] = char_tokens("ok")
    fake.scripts["emoji"] = byte_tokens("🌟ok")  # four tokens before the first character
    plain = engine.submit(ask("hi", greedy(3), request_id="plain")).result(timeout=TIMEOUT).figures
    emoji = engine.submit(ask("hi", greedy(6), request_id="emoji")).result(timeout=TIMEOUT).figures
    assert plain["ttft"] == pytest.approx(decode_start(plain))  # its first token had text
    assert emoji["ttft"] > decode_start(emoji) + 3 * 0.001  # three more steps
    assert engine.snapshot()["histograms"]["ttft"]["count"] == 2


def test_text_held_back_to_the_end_is_sent_then_and_that_is_the_ttft(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.001))
    fake.scripts["r"] = char_tokens("ab")  # all of it may begin the stop string
    events = collect(engine.submit(ask("hi", greedy(2, stop=["abc"]), request_id="r")))
    assert [e.text for e in tokens_of(events)] == ["", "", "ab"]
    f = events[-1].figures
    assert f["ttft"] == pytest.approx(f["total_time"])
    assert engine.snapshot()["histograms"]["ttft"]["count"] == 1


# --- limits ----------------------------------------------------------------------------------


def test_a_prompt_that_fills_the_sequence_is_refused_at_submit(make_engine):
    engine, _ = make_engine(FakeRunner(ctx_per_seq=32))
    with pytest.raises(PromptTooLong):
        engine.submit(ask("x" * 32))
    with pytest.raises(PromptTooLong):
        engine.submit(ask(""))
    done = engine.submit(ask("x" * 31, greedy(10))).result(timeout=TIMEOUT)
    assert (done.finish_reason, done.figures["output_tokens"]) == ("length", 1)


def test_generation_that_reaches_the_sequence_length_ends_with_length(make_engine):
    engine, fake = make_engine(FakeRunner(ctx_per_seq=32))
    done = engine.submit(ask("y" * 28, greedy(100), request_id="r")).result(timeout=TIMEOUT)
    assert done.finish_reason == "length"
    assert done.figures["output_tokens"] == 4
    assert max(c[2] + c[3] for c in fake.chunks_of("r")) <= 32


def test_the_queue_is_bounded(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=1, overhead=0.005), max_queue=2)
    first = engine.submit(ask("running", greedy(200)))
    events = first.events(timeout=TIMEOUT)
    assert [next(events).phase, next(events).phase] == ["waiting", "prefilling"]
    waiting = [engine.submit(ask("one", greedy(1))), engine.submit(ask("two", greedy(1)))]
    with pytest.raises(QueueFull):
        engine.submit(ask("three", greedy(1)))
    assert engine.snapshot()["outcomes"]["rejected"] == 1
    first.cancel()
    for handle in waiting:
        assert handle.result(timeout=TIMEOUT).finish_reason == "length"


def test_a_submit_before_start_or_after_shutdown_is_refused(make_engine):
    engine, _ = make_engine()
    engine.shutdown()
    with pytest.raises(EngineStopped):
        engine.submit(ask("hi"))


# --- concurrency -----------------------------------------------------------------------------


def test_four_concurrent_requests_all_complete_each_with_its_answer_alone(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=4, n_batch=32, overhead=0.001))
    prompts = ["short", "a somewhat longer prompt than that", "x" * 70, "the fourth one"]
    handles = [engine.submit(ask(p, greedy(12 + i))) for i, p in enumerate(prompts)]
    for i, (prompt, handle) in enumerate(zip(prompts, handles, strict=True)):
        done = handle.result(timeout=TIMEOUT)
        assert done.text == alone_output(prompt, 12 + i)
    assert max(len(step) for step in fake.steps) >= 2  # they really ran side by side
    assert_all_freed(engine, fake)


def test_more_requests_than_slots_all_complete_in_turn(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=2))
    handles = [engine.submit(ask(f"prompt {i}", greedy(5))) for i in range(7)]
    for i, handle in enumerate(handles):
        assert handle.result(timeout=TIMEOUT).text == alone_output(f"prompt {i}", 5)
    assert_all_freed(engine, fake)


def test_the_next_turn_of_a_conversation_only_prefills_what_is_new(make_engine):
    engine, fake = make_engine()
    first = engine.submit(ask("Q1?", greedy(6), cache_key="conv", request_id="t1")).result(TIMEOUT)
    second_prompt = "Q1?" + first.text + " Q2?"
    second = engine.submit(ask(second_prompt, greedy(3), cache_key="conv", request_id="t2"))
    done = second.result(timeout=TIMEOUT)
    assert done.figures["cached_tokens"] == 3 + 6 - 1
    assert fake.chunks_of("t2")[0][2] == 8  # the prefill started after the cached prefix
    assert done.text == alone_output(second_prompt, 3)
    assert engine.snapshot()["totals"]["cached_tokens"] == 8


# --- cancellation ----------------------------------------------------------------------------


def test_cancelling_a_waiting_request_ends_it_and_frees_its_sampler(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=1, overhead=0.003))
    running = engine.submit(ask("first", greedy(30)))
    assert wait_until(lambda: fake.chunks_of(running.id))
    waiting = engine.submit(ask("second", greedy(30)))
    assert wait_until(lambda: engine.snapshot()["queue_depth"] == 1)
    waiting.cancel()
    events = collect(waiting)
    assert [(e.type, getattr(e, "phase", None)) for e in events] == [
        ("phase", "waiting"), ("progress", "waiting"), ("done", None)
    ]
    assert events[1].ahead == 0  # next in line, behind the running one
    assert events[-1].finish_reason == "cancelled"
    assert events[-1].figures["output_tokens"] == 0
    assert waiting.id in fake.released
    assert running.result(timeout=TIMEOUT).finish_reason == "length"
    assert fake.chunks_of(waiting.id) == []
    assert_all_freed(engine, fake)


def test_cancelling_a_prefilling_request_frees_its_slot_sampler_and_kv(make_engine):
    fake = FakeRunner(n_batch=16, ctx_per_seq=512, per_token=0.003)
    engine, fake = make_engine(fake)
    handle = engine.submit(ask("p" * 400, greedy(5)))  # 25 prefill steps of 16 tokens
    assert wait_until(lambda: len(fake.chunks_of(handle.id)) >= 2)
    handle.cancel()
    events = collect(handle)
    assert events[-1].type == "done" and events[-1].finish_reason == "cancelled"
    assert not tokens_of(events)
    assert handle.id in fake.released
    assert len(fake.chunks_of(handle.id)) < 25
    seq = fake.steps[0][0][1]
    assert wait_until(lambda: fake.kv_used() == 0)
    assert KvTrim(seq, 0) in fake.trims
    assert_all_freed(engine, fake)
    assert engine.snapshot()["kv_used"] == 0


def test_cancelling_a_decoding_request_frees_its_slot_sampler_and_kv(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.002))
    handle = engine.submit(ask("decode me", greedy(1000)))
    events = handle.events(timeout=TIMEOUT)
    seen = [next(events) for _ in range(3 + 2 + 3)]  # three phases, two progress, three tokens
    assert [e.type for e in seen[5:]] == ["token"] * 3
    handle.cancel()
    rest = list(events)
    assert rest[-1].type == "done" and rest[-1].finish_reason == "cancelled"
    assert 3 <= rest[-1].figures["output_tokens"] < 1000
    assert rest[-1].text.startswith("".join(e.text for e in seen[5:]))
    assert wait_until(lambda: fake.kv_used() == 0)
    assert_all_freed(engine, fake)
    assert engine.snapshot()["outcomes"]["cancelled"] == 1


def test_cancelling_a_finished_or_unknown_request_does_nothing(make_engine):
    engine, fake = make_engine()
    handle = engine.submit(ask("hi", greedy(2)))
    handle.result(timeout=TIMEOUT)
    handle.cancel()
    engine.cancel("nobody")
    assert engine.submit(ask("again", greedy(2))).result(timeout=TIMEOUT).finish_reason == "length"


# --- failures --------------------------------------------------------------------------------


def test_a_decode_error_fails_that_request_and_the_next_one_still_works(make_engine):
    engine, fake = make_engine()
    fake.fail_for.add("bad")
    bad = collect(engine.submit(ask("boom", greedy(5), request_id="bad")))
    error = bad[-1]
    assert isinstance(error, ErrorEvent)
    assert "failed to run" in error.message and "fake decode error in bad" in error.message
    assert error.figures["finish_reason"] == "error"
    assert "bad" in fake.released
    good = engine.submit(ask("fine", greedy(4))).result(timeout=TIMEOUT)
    assert good.finish_reason == "length" and good.text == alone_output("fine", 4)
    assert wait_until(lambda: fake.kv_used() == len("fine") + 3)  # only the cached good turn
    assert engine.snapshot()["outcomes"]["failed"] == 1
    assert_all_freed(engine, fake)


def test_a_crash_of_the_engine_loop_fails_running_requests_and_refuses_new_ones(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.002), prefix_cache=False)
    fake.fail_trim = True  # the first KV trim (a request ending) breaks the loop itself
    short = engine.submit(ask("short", greedy(2)))
    long = engine.submit(ask("long", greedy(1000)))
    assert short.result(timeout=TIMEOUT).finish_reason == "length"
    final = long.result(timeout=TIMEOUT)
    assert isinstance(final, ErrorEvent) and "stopped" in final.message
    with pytest.raises(EngineStopped):
        engine.submit(ask("after the crash"))
    assert wait_until(lambda: not engine.busy)  # a dead engine must not read as answering
    assert fake.samplers == set()


# --- shutdown --------------------------------------------------------------------------------


def test_shutdown_ends_running_and_waiting_requests_with_an_error(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=1, overhead=0.003))
    running = engine.submit(ask("running", greedy(1000)))
    assert wait_until(lambda: fake.chunks_of(running.id))
    waiting = engine.submit(ask("waiting", greedy(10)))
    engine.shutdown()
    for handle in (running, waiting):
        final = handle.result(timeout=TIMEOUT)
        assert isinstance(final, ErrorEvent)
        assert "stopped" in final.message
    assert fake.closed
    assert fake.samplers == set()
    with pytest.raises(EngineStopped):
        engine.submit(ask("late"))


def test_shutdown_ends_requests_still_in_the_inbox_with_an_error(make_engine):
    engine, fake = make_engine()
    fake.gate = threading.Event()  # the next step blocks until the gate opens
    running = engine.submit(ask("running", greedy(1000)))
    assert fake.executing.wait(TIMEOUT)
    queued = engine.submit(ask("queued", greedy(5)))  # sits in the inbox: the loop is mid-step
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    assert wait_until(engine._stopping.is_set)
    fake.gate.set()
    stopper.join(TIMEOUT)
    for handle in (running, queued):
        final = handle.result(timeout=2.0)
        assert isinstance(final, ErrorEvent)
    assert not engine.busy


def test_a_shutdown_that_times_out_mid_step_closes_the_runner_only_after_the_step(make_engine):
    engine, fake = make_engine()
    fake.gate = threading.Event()
    running = engine.submit(ask("running", greedy(1000)))
    assert fake.executing.wait(TIMEOUT)
    engine.shutdown(timeout=0.05)  # the step is still blocked
    assert not fake.closed
    fake.gate.set()
    assert isinstance(running.result(timeout=TIMEOUT), ErrorEvent)
    assert wait_until(lambda: fake.closed)
    assert fake.violations == []


# --- readings from other threads and loops ---------------------------------------------------


def test_events_can_be_read_from_an_asyncio_loop(make_engine):
    engine, _ = make_engine(FakeRunner(overhead=0.001))

    async def consume():
        handle = engine.submit(ask("async", greedy(4)))
        return [event async for event in handle.aevents()]

    events = asyncio.run(asyncio.wait_for(consume(), TIMEOUT))
    assert isinstance(events[0], PhaseEvent) and events[0].phase == "waiting"
    assert events[-1].type == "done"
    assert events[-1].text == alone_output("async", 4)


def test_aevents_picks_up_events_delivered_before_it_started(make_engine):
    engine, _ = make_engine()
    handle = engine.submit(ask("early", greedy(3)))
    assert wait_until(lambda: handle.final is not None)

    async def consume():
        return [event async for event in handle.aevents()]

    events = asyncio.run(asyncio.wait_for(consume(), TIMEOUT))
    assert [e.type for e in events][-4:] == ["token", "token", "token", "done"]


def test_a_snapshot_from_another_thread_while_running_is_sane(make_engine):
    fake = FakeRunner(n_slots=2, n_batch=32, overhead=0.002, per_token=0.0002)
    engine, fake = make_engine(fake)
    snapshots = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            snapshots.append(engine.snapshot())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    handles = [engine.submit(ask(f"prompt number {i} " * 3, greedy(20))) for i in range(5)]
    for handle in handles:
        assert handle.result(timeout=TIMEOUT).type == "done"
    stop.set()
    watcher.join()
    assert len(snapshots) > 10
    for snap in snapshots:
        assert 0 <= snap["queue_depth"] <= 5
        assert 0 <= snap["active_sequences"] <= 2
        assert 0.0 <= snap["kv_fill"] <= 1.0
        assert snap["prompt_tps"] >= 0 and snap["output_tps"] >= 0
        assert snap["token_budget"] <= 32
        assert snap["slots"] == 2 and snap["kv_size"] == fake.n_ctx
    assert max(s["active_sequences"] for s in snapshots) == 2
    assert max(s["queue_depth"] for s in snapshots) >= 1
    final = engine.snapshot()
    assert final["outcomes"]["length"] == 5
    assert final["totals"]["output_tokens"] == 100
    assert final["histograms"]["ttft"]["count"] == 5
    assert final["output_tps"] > 0


def test_a_call_runs_on_the_engine_thread_with_its_result_or_its_exception(make_engine):
    engine, _ = make_engine()
    assert engine.on_engine_thread(lambda: threading.current_thread().name).result(5) == (
        "engine-"
    )

    def broken():
        raise RuntimeError("warm-up failed")

    with pytest.raises(RuntimeError, match="warm-up failed"):
        engine.on_engine_thread(broken).result(5)
    assert engine.alive  # the loop goes on


def test_a_running_requests_priority_can_change_and_shows_in_its_stream_row():
    engine = Engine(FakeRunner(overhead=0.01), itl_target=0.05).start()
    try:
        handle = engine.submit(ask("hi", greedy(200)))
        assert wait_until(lambda: engine.snapshot()["streams"])
        engine.set_priority(handle.id, "background")
        assert wait_until(
            lambda: [r["priority"] for r in engine.snapshot()["streams"]] == ["background"]
        )
        engine.set_priority("no-such-request", "background")  # ignored
        with pytest.raises(ValueError):
            engine.set_priority(handle.id, "urgent")
        handle.cancel()
    finally:
        engine.shutdown()


def test_the_snapshot_shows_each_share_and_priority_with_its_work_and_the_tokens_it_was_served(
    make_engine,
):
    engine, fake = make_engine(FakeRunner(n_slots=4, overhead=0.002))  # one slot in reserve
    app = [engine.submit(ask(f"document {i}", greedy(500), share="apikey:3",
                             priority="background")) for i in range(5)]  # fmt: skip
    assert wait_until(lambda: len(engine.snapshot()["streams"]) == 3)  # the reserve is held
    person = engine.submit(ask("hello", greedy(500), share="user:5"))

    def rows():
        return {(r["share"], r["priority"]): r for r in engine.snapshot()["shares"]}

    assert wait_until(lambda: rows().get(("user:5", "interactive"), {}).get("tokens_recent"))
    assert wait_until(lambda: len(engine.snapshot()["streams"]) == 4
                      and all(r["output_tokens"] >= 3 for r in engine.snapshot()["streams"]))
    snap = engine.snapshot()
    shares = {(r["share"], r["priority"]): r for r in snap["shares"]}
    assert set(shares) == {("apikey:3", "background"), ("user:5", "interactive")}
    assert {k: shares[("apikey:3", "background")][k] for k in ("running", "waiting")} == {
        "running": 3, "waiting": 2}  # fmt: skip
    assert shares[("user:5", "interactive")]["running"] == 1
    assert all(row["tokens_recent"] > 0 and row["paused"] == 0 for row in shares.values())
    assert {(r["share"], r["priority"], r["paused"]) for r in snap["streams"]} == {
        ("apikey:3", "background", False), ("user:5", "interactive", False)}  # fmt: skip

    by_priority = snap["by_priority"]
    assert set(by_priority) == {"interactive", "background"}
    for priority, first_tokens in (("interactive", 1), ("background", 3)):
        figures = by_priority[priority]
        assert figures["histograms"]["ttft"]["count"] == first_tokens
        assert figures["ttft"]["p50"] > 0 and figures["itl"]["p50"] > 0
        assert set(figures["histograms"]["itl"]) == set(snap["histograms"]["itl"])
    steps = snap["steps"]
    assert any(steps["interactive"]) and max(steps["background"]) == 3
    assert all(b <= d for b, d in zip(steps["background"], steps["decode"], strict=True))
    for handle in (*app, person):
        handle.cancel()


def test_the_share_table_keeps_the_32_largest_rows(make_engine):
    engine, fake = make_engine(FakeRunner(n_slots=1, overhead=0.002))
    running = engine.submit(ask("running", greedy(2000), share="apikey:1"))
    assert wait_until(lambda: fake.chunks_of(running.id))
    waiting = [engine.submit(ask(f"q{i}", greedy(2), share=f"user:{i}")) for i in range(40)]
    assert wait_until(lambda: engine.snapshot()["queue_depth"] == 40)
    shares = engine.snapshot()["shares"]
    assert len(shares) == 32
    assert shares[0]["share"] == "apikey:1" and shares[0]["running"] == 1  # served the most
    assert all(row["waiting"] == 1 for row in shares[1:])
    for handle in (running, *waiting):
        handle.cancel()
