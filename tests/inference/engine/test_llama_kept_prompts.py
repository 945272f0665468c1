"""Warm memory on real llama.cpp with the real small model: a sequence saved and restored, into
another sequence id and trimmed to a prefix, goes on exactly as the original would have."""

import pytest

from inference.engine import Engine, SamplingParams
from inference.engine.prefix_cache import KvTrim
from inference.engine.tiers import PromptStore
from inference.engine.tiers.config import PromptCacheConfig, open_store
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

CHAT = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n" \
       "<|im_start|>assistant\n"  # fmt: skip
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture
def make_runner(starter_path, extra_bufts):
    """A runner for one engine (Engine.shutdown closes its runner); its RunnerConfig is
    `runner.made_with`."""
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    def make(slots: int = 2, **settings):
        config = RunnerConfig(**{"model_path": str(starter_path), "ctx_per_seq": 1024,
                                 "parallel": slots, "cache_slots": 0, "n_threads": 2,
                                 "use_extra_bufts": extra_bufts, **settings})  # fmt: skip
        runner = LlamaRunner(config)
        runner.made_with = config
        return runner

    return make


def prompt(n: int, question: str) -> str:
    system = f"Household notes, part {n}: " + "the heating runs from six to nine. " * 20
    return CHAT.format(system=system, question=question)


def test_a_saved_state_restores_into_another_sequence_and_a_prefix_continues(make_runner):
    runner = make_runner()
    ids = runner.tokenize(prompt(1, "When does the heating run?"))
    engine = Engine(runner, itl_target=1.0).start()
    try:
        # Read into sequence 0 and kept there (the runner's own state API, as the engine uses it).
        list(engine.submit(ask(tuple(ids), SamplingParams(max_tokens=1))).events(timeout=120))
        state = engine.on_engine_thread(lambda: runner.save(0)).result()
        assert len(state) > 100_000  # ~23 KB a token for this model
        # What the RAM tier takes room for before the copy is the copy's size.
        assert engine.on_engine_thread(lambda: runner.state_size(0)).result() == len(state)
        assert engine.on_engine_thread(lambda: runner.restore(1, bytearray(state))).result()
        assert engine.on_engine_thread(lambda: runner.continues(1, len(ids))).result()
        assert not engine.on_engine_thread(lambda: runner.continues(1, len(ids) - 5)).result()
        engine.on_engine_thread(lambda: runner.trim([KvTrim(1, len(ids) - 5)])).result()
        assert engine.on_engine_thread(lambda: runner.continues(1, len(ids) - 5)).result()
        refused = engine.on_engine_thread(lambda: runner.restore(1, bytearray(b"junk"))).result()
        assert refused is False and engine.on_engine_thread(lambda: runner.continues(1, 0)).result()
    finally:
        engine.shutdown()


def test_answers_restored_from_the_ram_tier_are_those_of_a_prefix_kept_resident(make_runner):
    """Four conversations, two turns each: through two slots and the RAM tier, every answer
    and cached-token count is what four resident slots give (the same prefix reused at the same
    point: a restore is the KV itself, not a recomputation)."""
    questions = ["When does the heating run?", "Why six?", "And on Sundays?", "Is it gas?"]

    def conversation(engine) -> list[tuple[str, int]]:
        history = {n: prompt(n, q) for n, q in enumerate(questions)}
        seen = []
        for _ in range(2):
            for n in range(len(questions)):
                request = ask(history[n], GREEDY, cache_key=f"c{n}", cache_partition="p")
                done = list(engine.submit(request).events(timeout=120))[-1]
                seen.append((done.text, done.figures["cached_tokens"],
                             done.figures["cached_by_tier"]))  # fmt: skip
                history[n] += done.text + "<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n" \
                    "<|im_start|>assistant\n"  # fmt: skip
        return seen

    reference = Engine(make_runner(slots=4), itl_target=1.0).start()  # every turn kept resident
    try:
        expected = conversation(reference)
    finally:
        reference.shutdown()
    warm = Engine(make_runner(), itl_target=1.0, prompts=PromptStore(1 << 30)).start()
    try:
        got = conversation(warm)
    finally:
        warm.shutdown()
    assert [(text, cached) for text, cached, _ in got] == [
        (text, cached) for text, cached, _ in expected]  # fmt: skip
    later = [tiers for _, _, tiers in got[len(questions):]]
    assert all(t["ram"] > 0 and t["resident"] == 0 for t in later)  # from RAM, not a slot
    assert all(t["resident"] > 0 for _, _, t in expected[len(questions):])


def test_a_reload_with_another_context_and_offload_restores_what_the_last_load_kept(
    make_runner, tmp_path
):
    """The preflight or a client's num_ctx reloads a model with another context: what it kept
    on disk restores into the new one (llama.cpp takes a state into any context it fits), and
    the answer is the one the last load gave."""
    config = PromptCacheConfig(str(tmp_path / "embedded"), ram_bytes=1 << 30,
                               disk_bytes=1 << 30)  # fmt: skip
    request = dict(cache_key="c", cache_partition="p")
    question = prompt(1, "When does the heating run?")

    def load(**settings) -> Engine:
        runner = make_runner(**settings)
        store = open_store(config, runner.made_with, runner)
        return Engine(runner, itl_target=1.0, prompts=store).start()

    first = load(ctx_per_seq=1024, n_gpu_layers=-1)
    before = list(first.submit(ask(question, GREEDY, **request)).events(timeout=120))[-1]
    first.shutdown()
    assert first.persist_prompts(30) == 1
    second = load(ctx_per_seq=512, n_gpu_layers=0)
    try:
        after = list(second.submit(ask(question, GREEDY, **request)).events(timeout=120))[-1]
    finally:
        second.shutdown()
        second.persist_prompts(30)
    assert after.figures["cached_by_tier"]["disk"] == before.figures["prompt_tokens"] - 1
    assert after.text == before.text


def test_a_state_of_another_kv_type_is_refused_by_llama_cpp_not_a_crash(make_runner):
    """Entries of another KV type live in another directory; should one reach llama.cpp all
    the same, it refuses it (the engine then reads the prompt: a miss)."""
    saving = make_runner(slots=1)
    engine = Engine(saving, itl_target=1.0).start()
    try:
        ids = saving.tokenize(prompt(2, "Why six?"))
        list(engine.submit(ask(tuple(ids), SamplingParams(max_tokens=1))).events(timeout=120))
        state = engine.on_engine_thread(lambda: saving.save(0)).result()
    finally:
        engine.shutdown()
    other = make_runner(slots=1, kv_type="q8_0")
    try:
        assert other.restore(0, bytearray(state)) is False
        assert other.continues(0, 0)  # the sequence left empty
    finally:
        other.close()
