"""Log-probabilities through the engine loop, on the fake runner: they ride on the token events
of the request that asked, and a request that did not ask costs the runner nothing."""

import threading

from inference.engine.events import TokenEvent
from inference.engine.params import SamplingParams

from .fakes import FakeRunner, ask

TIMEOUT = 10.0


def token_events(handle) -> list[TokenEvent]:
    return [e for e in handle.events(timeout=TIMEOUT) if isinstance(e, TokenEvent)]


def test_each_token_event_carries_the_log_probabilities_of_its_own_token(make_engine):
    engine, fake = make_engine()
    events = token_events(engine.submit(ask("Hello", SamplingParams(max_tokens=6, logprobs=3))))
    assert len(events) == 6
    for event in events:
        assert event.logprobs.chosen.token_id == event.token_id
        assert event.logprobs.chosen.piece == event.text.encode()
        assert [t.logprob for t in event.logprobs.top] == sorted(
            (t.logprob for t in event.logprobs.top), reverse=True)  # fmt: skip
        assert len(event.logprobs.top) == 3


def test_zero_asks_for_the_sampled_tokens_alone(make_engine):
    engine, _ = make_engine()
    events = token_events(engine.submit(ask("Hi", SamplingParams(max_tokens=3, logprobs=0))))
    assert all(e.logprobs.chosen.token_id == e.token_id and e.logprobs.top == () for e in events)


def test_a_request_that_does_not_ask_gets_none_and_costs_the_runner_nothing(make_engine):
    engine, fake = make_engine(FakeRunner(overhead=0.002))
    asking = ask("one stream asks", SamplingParams(max_tokens=8, logprobs=20))
    others = [ask(f"stream {n} does not", SamplingParams(max_tokens=8)) for n in range(3)]
    results: dict[str, list[TokenEvent]] = {}

    def run(request) -> None:
        results[request.request_id] = token_events(engine.submit(request))

    threads = [threading.Thread(target=run, args=(r,)) for r in (asking, *others)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    shared = [step for step in fake.steps if len({c[0] for c in step}) > 1]
    assert shared, "the premise: the four ran in the same steps"
    assert set(fake.logprobs_asked) == {asking.request_id}
    assert len(fake.logprobs_asked) == 8  # once per token of the one that asked
    assert all(e.logprobs is not None for e in results[asking.request_id])
    for other in others:
        assert [e.logprobs for e in results[other.request_id]] == [None] * 8


def test_the_tokens_of_a_held_back_stop_string_carry_theirs_too(make_engine):
    engine, fake = make_engine()
    request = ask("x", SamplingParams(max_tokens=10, logprobs=1, stop=["cd"]))
    fake.scripts[request.request_id] = [ord(c) for c in "abcde"]
    events = token_events(engine.submit(request))
    assert [(e.text, e.logprobs.chosen.piece) for e in events] == [
        ("a", b"a"), ("b", b"b"), ("", b"c"), ("", b"d")]  # fmt: skip
