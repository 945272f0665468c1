"""Stall-free batching: a long prompt arriving mid-stream does not freeze the stream.

The fake's step takes overhead + per_token * tokens (a sleep), like a real model. The two modes run
side by side in one test and are compared with each other; the bound on the chunked mode is loose
(2.5x the target) because CI machines are noisy.
"""

from inference.engine.events import TokenEvent
from inference.engine.params import SamplingParams
from tests.inference.engine.fakes import ask

from .fakes import FakeRunner

ITL_TARGET = 0.05
OVERHEAD = 0.005
PER_TOKEN = 0.002
LONG_PROMPT = 400  # 0.8 s of prefill in one step


def stream_with_a_long_prompt_arriving(make_engine, chunked: bool) -> tuple[dict, dict]:
    """Figures of stream A and of the long prompt B that arrives while A decodes."""
    fake = FakeRunner(
        n_ctx=4096, n_slots=4, ctx_per_seq=1024, n_batch=512, overhead=OVERHEAD,
        per_token=PER_TOKEN,
    )  # fmt: skip
    engine, _ = make_engine(fake, itl_target=ITL_TARGET, chunked_prefill=chunked)
    a = engine.submit(ask("stream A, a prompt of some length", SamplingParams(max_tokens=80)))
    events = a.events(timeout=10)
    tokens = 0
    while tokens < 5:
        tokens += isinstance(next(events), TokenEvent)
    b = engine.submit(ask("b" * LONG_PROMPT, SamplingParams(max_tokens=2)))
    *_, a_done = events
    b_done = b.result(timeout=10)
    assert a_done.type == b_done.type == "done"
    # B's prefill really happened while A was streaming.
    assert a_done.figures["total_time"] - a_done.figures["ttft"] > b_done.figures["prefill_time"]
    return a_done.figures, b_done.figures


def test_a_long_prompt_does_not_stall_a_running_stream_with_chunked_prefill(make_engine):
    chunked_a, chunked_b = stream_with_a_long_prompt_arriving(make_engine, chunked=True)
    whole_a, whole_b = stream_with_a_long_prompt_arriving(make_engine, chunked=False)

    chunked_gap = chunked_a["itl"]["max"]
    whole_gap = whole_a["itl"]["max"]
    # Chunked: A's worst gap stays near the target, B's prefill is spread over many steps.
    assert chunked_gap < 2.5 * ITL_TARGET
    assert len([t for t in chunked_b["timeline"] if t["phase"] == "prefill"]) >= 5
    # Whole prompts: A waits for all of B's prefill, which ran in one step.
    assert len([t for t in whole_b["timeline"] if t["phase"] == "prefill"]) == 1
    assert whole_gap >= whole_b["prefill_time"] * 0.95
    assert whole_gap > 3 * chunked_gap
    # The price of not stalling: B's first token comes later, but not absurdly so.
    assert chunked_b["ttft"] < 4 * whole_b["ttft"]
