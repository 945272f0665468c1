"""Speculation in the engine, on the fake runner: an answer is token for token what it is
without it, stops and limits cut a run of kept drafts exactly, and the KV left behind is
exactly the answer's (the next turn reuses it)."""

import pytest

from inference.engine.engine import Engine
from inference.engine.params import SamplingParams
from inference.engine.speculation.policy import PROBE_EVERY, Speculation

from .fakes import EOG, FakeRunner, ask, char_tokens, draft_model_of

# The answer copies a line of its prompt: prompt lookup drafts it.
LINES = "Lights: kitchen, hall, garage, attic, porch, cellar.\n"
PROMPT = "Repeat the list twice.\n" + LINES
ANSWER = LINES + LINES


def run(mode: str | None, params: SamplingParams, *, script: str = ANSWER, eog: bool = True,
        rid: str = "a", prompt: str = PROMPT, engine=None, **fields):  # fmt: skip
    """One answer (the fake model scripted to say `script`, then end); its final event, the
    runner and the engine."""
    if engine is None:
        fake = FakeRunner(n_slots=2, n_ctx=1024, ctx_per_seq=512, n_batch=64)
        engine = Engine(fake, itl_target=1.0,
                        speculation=Speculation(mode) if mode else None).start()  # fmt: skip
    engine.runner.scripts[rid] = char_tokens(script) + ([EOG] if eog else [])
    events = list(engine.submit(ask(prompt, params, request_id=rid, **fields)).events(timeout=10))
    return events, engine


def stepped(engine, rid: str) -> int:
    return len(engine.runner.chunks_of(rid))


@pytest.fixture
def engines():
    made = []
    yield made
    for engine in made:
        engine.shutdown()
        assert engine.runner.violations == []


def test_a_predictable_answer_is_the_same_in_fewer_steps(engines):
    params = SamplingParams(max_tokens=200)
    plain, off = run(None, params)
    fast, on = run("always", params)
    engines += [off, on]
    assert fast[-1].text == plain[-1].text == ANSWER
    assert stepped(on, "a") < stepped(off, "a") / 3
    figures = fast[-1].figures
    assert figures["drafted"] > figures["draft_accepted"] > len(ANSWER) // 2
    assert plain[-1].figures["drafted"] == 0
    tokens = [e.token_id for e in fast if e.type == "token"]
    assert tokens == [e.token_id for e in plain if e.type == "token"]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=200, stop=["garage"]),  # a stop string inside a kept run
    SamplingParams(max_tokens=61),  # max_tokens inside a kept run
    SamplingParams(max_tokens=200, stop=["porch, cel"]),
])  # fmt: skip
def test_stops_and_limits_cut_a_run_exactly_where_they_would_without_it(engines, params):
    plain, off = run(None, params)
    fast, on = run("always", params)
    engines += [off, on]
    assert fast[-1].text == plain[-1].text
    assert fast[-1].finish_reason == plain[-1].finish_reason
    assert fast[-1].figures["output_tokens"] == plain[-1].figures["output_tokens"]
    assert fast[-1].figures["draft_accepted"] > 0


def test_the_end_of_generation_inside_a_run_ends_it(engines):
    script = LINES + "kitchen, hall"  # then EOG, where the prompt goes on with ", garage"
    plain, off = run(None, SamplingParams(max_tokens=200), script=script)
    fast, on = run("always", SamplingParams(max_tokens=200), script=script)
    engines += [off, on]
    assert fast[-1].text == plain[-1].text == script and fast[-1].finish_reason == "stop"


def test_the_next_turn_reuses_exactly_the_kv_the_answer_left(engines):
    first, on = run("always", SamplingParams(max_tokens=200), cache_key="c")
    engines.append(on)
    follow = PROMPT + first[-1].text + "Once more.\n"
    second, _ = run("always", SamplingParams(max_tokens=60), engine=on, rid="b",
                    prompt=follow, script=LINES, cache_key="c")  # fmt: skip
    # The KV kept: the prompt and every answer token (the last was fed to sample the end).
    assert second[-1].figures["cached_tokens"] == len(PROMPT) + len(ANSWER)
    assert second[-1].text == LINES


def test_every_token_of_a_run_carries_its_own_logprobs(engines):
    fast, on = run("always", SamplingParams(max_tokens=40, logprobs=2))
    engines.append(on)
    tokens = [e for e in fast if e.type == "token" and e.token_id >= 0]
    assert len(tokens) == 40 and all(len(e.logprobs.top) == 2 for e in tokens)
    assert [e.logprobs.chosen.token_id for e in tokens] == [e.token_id for e in tokens]


def test_auto_drafts_nothing_for_unpredictable_text_where_each_token_costs_a_step(engines):
    fake = FakeRunner(n_slots=2, n_ctx=1024, ctx_per_seq=512, n_batch=64, per_token=0.002)
    engine = Engine(fake, itl_target=1.0, speculation=Speculation("auto")).start()
    engines.append(engine)
    for n in range(4):  # the fake model's own text: a hash of what came before, not a copy
        handle = engine.submit(ask(f"{n} " + PROMPT * (n + 1), SamplingParams(max_tokens=60)))
        list(handle.events(timeout=10))
    reading = engine.snapshot()["speculation"]
    assert reading["verify_tokens"] == 0 and reading["drafted"] == 0


def test_the_snapshot_and_the_step_log_tell_what_speculation_did(engines):
    fast, on = run("always", SamplingParams(max_tokens=200))
    engines.append(on)
    snap = on.snapshot()
    assert snap["speculation"]["drafted"] == fast[-1].figures["drafted"]
    assert snap["speculation"]["accepted"] == fast[-1].figures["draft_accepted"]
    assert sum(snap["steps"]["verify"]) == fast[-1].figures["drafted"]
    assert max(snap["steps"]["output"]) > 1  # steps that gave a stream several tokens


# --- a draft model -------------------------------------------------------------------------------


def free_text(mode: str | None, *, draft_model=None, per_token: float = 0.0,
              overhead: float = 0.0, draft_round_s: float | None = None,
              max_tokens: int = 120):  # fmt: skip
    """One answer of the fake model's own (unscripted) text, which its prompt does not predict:
    only a draft model can; its events and the engine. `overhead`, `per_token`: what a step
    costs (slept); `draft_round_s`: what the fake draft model says a drafted token cost."""
    fake = FakeRunner(n_slots=2, n_ctx=1024, ctx_per_seq=512, n_batch=64, per_token=per_token,
                      overhead=overhead)  # fmt: skip
    fake.draft_model = draft_model
    fake.draft_round_s = draft_round_s
    engine = Engine(fake, itl_target=1.0,
                    speculation=Speculation(mode) if mode else None).start()  # fmt: skip
    handle = engine.submit(ask("Tell me something new.", SamplingParams(max_tokens=max_tokens),
                               request_id="a"))  # fmt: skip
    return list(handle.events(timeout=10)), engine


def test_a_draft_model_drafts_what_the_text_cannot_and_the_answer_is_the_same(engines):
    plain, off = free_text(None)
    fast, on = free_text("always", draft_model=draft_model_of(0.9))
    engines += [off, on]
    assert fast[-1].text == plain[-1].text and len(plain[-1].text) == 120
    assert on.runner.drafts_asked and not off.runner.drafts_asked
    assert fast[-1].figures["draft_accepted"] > 50
    assert stepped(on, "a") < stepped(off, "a") / 2
    assert on.snapshot()["speculation"]["model_drafts"] > 0


def test_a_wrong_draft_models_guesses_cost_tokens_not_the_answer(engines):
    plain, off = free_text(None)
    fast, on = free_text("always", draft_model=draft_model_of(0.0))
    engines += [off, on]
    assert fast[-1].text == plain[-1].text
    assert fast[-1].figures["drafted"] > 0 and fast[-1].figures["draft_accepted"] == 0


def test_auto_asks_a_draft_model_that_does_not_pay_only_now_and_then(engines):
    fast, on = free_text("auto", draft_model=draft_model_of(0.0), per_token=0.002)
    engines.append(on)
    steps = stepped(on, "a")
    assert 0 < len(on.runner.drafts_asked) <= steps / PROBE_EVERY + 2
    assert len(fast[-1].text) == 120


def test_auto_keeps_asking_a_draft_model_that_pays(engines):
    # Steps cost the same for one token as for eight (a GPU: 5 ms a step) and a drafted token
    # costs a twentieth of one: a draft model that guesses well pays by far, on any box.
    fast, on = free_text("auto", draft_model=draft_model_of(0.95), overhead=0.005,
                         draft_round_s=0.00025)  # fmt: skip
    engines.append(on)
    # Asked far more often than its probes alone would be, and most of the answer is its.
    assert len(on.runner.drafts_asked) > 2 * (stepped(on, "a") / PROBE_EVERY + 2)
    assert fast[-1].figures["draft_accepted"] > 50
