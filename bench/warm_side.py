"""Bench sides for warm memory (bench/warm_memory.py), each run in a fresh process by bench.side.

- warm_restore: one engine, one sequence slot; a prefix of `prefix_tokens` is read, another
  prompt takes the slot (the prefix goes to the RAM tier, or is lost with `tiers` off), then the
  prefix and a question come: their TTFT, with what a restore took.
- warm_load: a runner process started as the product starts one (RunnerProcess, the starter
  model's automatic context and default slots): seconds from start to ready.
"""

import time

from bench.prompts import make_tokens


def side_warm_restore(args: dict) -> dict:
    from inference.engine import Engine, GenerationRequest, SamplingParams
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from inference.engine.tiers import PromptStore

    n = args["prefix_tokens"]
    ctx = 1 << max(11, (n + 300).bit_length())  # a power of two above prefix + question
    runner = LlamaRunner(RunnerConfig(model_path=args["model"], ctx_per_seq=ctx, parallel=1,
                                      cache_slots=0, n_threads=args["threads"]))  # fmt: skip
    store = PromptStore(8 << 30) if args["tiers"] else None
    engine = Engine(runner, prompts=store, itl_target=0.1).start()
    engine.on_engine_thread(runner.warm_up).result()

    def answer(ids: list[int], key: str) -> dict:
        request = GenerationRequest(tuple(ids), SamplingParams(temperature=0, max_tokens=1),
                                    cache_key=key, cache_partition="bench")  # fmt: skip
        return list(engine.submit(request).events(timeout=900))[-1].figures

    try:
        prefix = make_tokens(runner.tokenize, n, salt=7)
        answer(prefix, "kept")
        answer(make_tokens(runner.tokenize, 64, salt=8), "other")  # takes the one slot
        question = runner.tokenize(" And what does the next paragraph say? Answer:", False)
        figures = answer(prefix + question, "kept")
        kept = engine.snapshot()["prompt_cache"]
    finally:
        engine.shutdown()
    return {"ttft_s": figures["ttft"], "restore_s": figures["restore_time"],
            "cached": figures["cached_tokens"], "tier": figures["cached_by_tier"],
            "restore_mb": (kept.get("ram") or {}).get("bytes", 0) / 1e6}  # fmt: skip


def side_warm_load(args: dict) -> dict:
    import tempfile

    from inference.engine.runner_config import RunnerConfig
    from inference.engine.tiers.config import PromptCacheConfig
    from inference.serving.runner_process import RunnerProcess

    config = RunnerConfig(model_path=args["model"], ctx_per_seq=8192, parallel=4, cache_slots=0,
                          n_threads=args["threads"])  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        runner = RunnerProcess("bench", config,
                               prompt_cache=PromptCacheConfig(directory, 1 << 30, 1 << 30)).start()
        load = time.perf_counter() - started
        runner.shutdown()
    return {"load_s": load, "slots": config.parallel + config.cache_slots, "ctx_per_seq": 8192}
