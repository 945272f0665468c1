"""Diagnostic: does it matter which thread runs a context's first llama_decode?

    python bench/warmup_thread.py [--threads 2] [--tries 3]

Each case runs in a fresh process: a raw llama.cpp context decodes single-sequence tokens on a
worker thread (as the engine's loop thread does), after a warm-up decode that ran either on that
same thread or on the main thread (as runner_main first ran LlamaRunner.warm_up, before it moved
the warm-up onto the engine thread for this reason). With libgomp, every thread that starts a
parallel region gets its own OpenMP thread pool; with more OpenMP threads than cores, libgomp
barely spins before it sleeps, so on a 2-core box each step pays futex wake-ups.
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(mode: str, threads: int) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.prompts import make_tokens
    from bench.raw import RawContext, RawModel, single_decode_tps
    from inference.catalog.starter import starter_model_path

    model = RawModel(str(starter_model_path()))
    ctx = RawContext(model, ctx_per_seq=2048, n_seq=8, n_batch=512, n_ubatch=512,
                     threads=threads)  # fmt: skip
    if mode == "main":
        ctx.warm_up(model.tokenize)
    out = []

    def work() -> None:
        if mode == "same":
            ctx.warm_up(model.tokenize)
        out.extend(single_decode_tps(ctx, make_tokens(model.tokenize, 32, 300 + i), 64)
                   for i in range(4))  # fmt: skip

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(json.dumps(statistics.median(out)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--child", choices=("same", "main"))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads)
        return
    results: dict[str, list[float]] = {"same": [], "main": []}
    for _ in range(args.tries):
        for mode in results:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--threads", str(args.threads)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for mode, label in (("same", "warm-up on the decoding thread"),
                        ("main", "warm-up on the main thread")):  # fmt: skip
        values = ", ".join(f"{v:.1f}" for v in results[mode])
        print(f"{label}: decode {statistics.median(results[mode]):.1f} tok/s ({values})")


if __name__ == "__main__":
    main()
