"""Log-probabilities on real llama.cpp with the starter model, checked against what they must be:
the greedy token is the likeliest, every number is a log of a probability, and each step equals
llama-cpp-python's own high-level computation (Llama with logits_all=True) of the same tokens."""

import math
import threading

import numpy as np
import pytest

from inference.engine import Engine, SamplingParams
from inference.engine.events import TokenEvent
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
PROMPT = CHAT.format(question="Name a colour.")
CLOSE = 1e-4  # the same kernels on both sides (flash attention): float32 noise only


@pytest.fixture(scope="module")
def engine(starter_path, extra_bufts):
    """Its own engine (llama.cpp loaded into this process, as test_llama_runner's is)."""
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    config = RunnerConfig(model_path=str(starter_path), ctx_per_seq=512, parallel=4,
                          n_threads=2, use_extra_bufts=extra_bufts)  # fmt: skip
    engine = Engine(LlamaRunner(config), itl_target=0.1).start()
    yield engine
    engine.shutdown()


def tokens(engine, prompt: str, params: SamplingParams) -> list[TokenEvent]:
    events = list(engine.submit(ask(prompt, params)).events(timeout=120))
    assert events[-1].type == "done", events[-1]
    return [e for e in events if e.type == "token" and e.token_id >= 0]


@pytest.fixture(scope="module")
def reference(starter_path, extra_bufts):
    """The step-by-step log-softmax of llama-cpp-python's high-level Llama over a token
    sequence: row i is the distribution after its first i + 1 tokens."""
    import llama_cpp.llama_cpp as low_level
    from llama_cpp import Llama

    defaults = low_level.llama_model_default_params

    def host_defaults():  # the self-check's verdict, as test_llama_runner gives it
        params = defaults()
        params.use_extra_bufts = extra_bufts
        return params

    low_level.llama_model_default_params = host_defaults
    try:
        llm = Llama(str(starter_path), n_ctx=512, n_threads=2, flash_attn=True, logits_all=True,
                    verbose=False)  # fmt: skip
    finally:
        low_level.llama_model_default_params = defaults

    def log_softmax(ids: list[int], temperature: float = 1.0) -> np.ndarray:
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float64) / temperature
        return np.stack([Llama.logits_to_logprobs(row) for row in scores])

    yield llm, log_softmax
    llm.close()


def test_greedy_tokens_are_the_likeliest_and_the_numbers_are_log_probabilities(engine):
    steps = tokens(engine, PROMPT, SamplingParams(temperature=0.0, max_tokens=12, logprobs=20))
    assert len(steps) == 12
    for step in steps:
        chosen, top = step.logprobs.chosen, step.logprobs.top
        assert len(top) == 20 and len({t.token_id for t in top}) == 20
        assert top[0].token_id == chosen.token_id == step.token_id
        assert top[0].logprob == chosen.logprob
        logprobs = [t.logprob for t in top]
        assert logprobs == sorted(logprobs, reverse=True)
        assert all(value <= 0.0 for value in logprobs)
        assert sum(math.exp(value) for value in logprobs) <= 1.0 + 1e-9
        assert chosen.piece == engine.runner.piece(step.token_id)


def test_every_step_equals_llama_cpp_pythons_own_log_softmax(engine, reference):
    llm, log_softmax = reference
    steps = tokens(engine, PROMPT, SamplingParams(temperature=0.0, max_tokens=8, logprobs=5))
    prompt_ids = engine.runner.tokenize(PROMPT)
    assert llm.tokenize(PROMPT.encode(), add_bos=True, special=True) == prompt_ids
    rows = log_softmax(prompt_ids + [s.token_id for s in steps])[len(prompt_ids) - 1 :]
    for step, row in zip(steps, rows, strict=False):
        assert step.logprobs.chosen.logprob == pytest.approx(row[step.token_id], abs=CLOSE)
        expected = np.argsort(-row, kind="stable")[:5]
        assert [t.token_id for t in step.logprobs.top] == list(expected)
        assert [t.logprob for t in step.logprobs.top] == pytest.approx(row[expected], abs=CLOSE)


def test_a_sampled_answer_reports_the_distribution_at_its_temperature(engine, reference):
    _, log_softmax = reference
    params = SamplingParams(temperature=0.6, top_k=0, top_p=1.0, min_p=0.0, seed=7,
                            max_tokens=6, logprobs=3)  # fmt: skip
    steps = tokens(engine, PROMPT, params)
    prompt_ids = engine.runner.tokenize(PROMPT)
    rows = log_softmax(prompt_ids + [s.token_id for s in steps], temperature=0.6)
    for step, row in zip(steps, rows[len(prompt_ids) - 1 :], strict=False):
        assert step.logprobs.chosen.logprob == pytest.approx(row[step.token_id], abs=CLOSE)
        assert step.logprobs.top[0].logprob == pytest.approx(row.max(), abs=CLOSE)


def test_one_stream_that_asks_beside_three_that_do_not_gets_what_it_gets_alone(engine):
    asked = SamplingParams(temperature=0.0, max_tokens=10, logprobs=20)
    plain = SamplingParams(temperature=0.0, max_tokens=10)
    questions = ["What is rain?", "Say hi in Dutch.", "Name a fruit."]
    alone = tokens(engine, PROMPT, asked)
    solo = [[e.token_id for e in tokens(engine, CHAT.format(question=q), plain)]
            for q in questions]  # fmt: skip
    results: dict[int, list[TokenEvent]] = {}

    def run(index: int, prompt: str, params: SamplingParams) -> None:
        results[index] = tokens(engine, prompt, params)

    jobs = [(0, PROMPT, asked)] + [(i + 1, CHAT.format(question=q), plain)
                                   for i, q in enumerate(questions)]  # fmt: skip
    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    together = results[0]
    assert [e.token_id for e in together] == [e.token_id for e in alone]
    for batched, single in zip(together, alone, strict=True):
        ours, theirs = batched.logprobs.top, single.logprobs.top
        assert [t.token_id for t in ours] == [t.token_id for t in theirs]
        assert [t.logprob for t in ours] == pytest.approx([t.logprob for t in theirs], abs=CLOSE)
    for index, ids in enumerate(solo, start=1):
        assert [e.token_id for e in results[index]] == ids
        assert all(e.logprobs is None for e in results[index])
