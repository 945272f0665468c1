"""Benchmark: what log-probabilities cost the streams that ask for them, and the ones that do not.

    python bench/logprobs.py [--rounds 3] [--steps 96] [--threads 2] [--no-extra-bufts]
                             [--model PATH] [--baseline DIR]

Four greedy streams decode together on the engine (each side a fresh process of its own, the
engine in-process and warmed up as a runner process does it), and each side reports their
aggregate decode tok/s over the window where all four decode, and the asking stream's own:

  none      no stream asks for logprobs
  one_top20 one stream asks for top_logprobs=20 (SamplingParams.logprobs=20), three do not
  all_top20 all four ask for top_logprobs=20
  baseline  (with --baseline DIR: a checkout of the code before logprobs, e.g.
            `git worktree add /tmp/base <commit>`) no stream asks, on that code

Rounds interleave the sides (baseline, none, one_top20, all_top20; each round starting one
further along) and every figure is a median over rounds. It prints one line per round and,
last, ONE JSON line of tok/s and ratios:

  none_vs_baseline   what the change costs a request that asks for nothing (1.0: nothing);
                     none_vs_baseline_range: its lowest and highest round (the noise)
  one_top20_vs_none  the batch's aggregate when one stream asks
  asker_vs_others    the asking stream's own tok/s ÷ the others' in the same batch
  all_top20_vs_none  the batch's aggregate when all four ask

Like bench/engine.py it needs a quiet machine: each side waits for one and reports how much of
the CPUs other processes took while it ran.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARK = "LOGPROBS-RESULT "
VARIANTS = {"none": (), "one_top20": (0,), "all_top20": (0, 1, 2, 3)}  # streams that ask
QUIET_SHARE = 0.05


# --- a side: one process, one engine ----------------------------------------------------------


def side(args: dict) -> dict:
    """Run in a fresh process with args["code"] first on sys.path (this tree or the baseline)."""
    sys.path.insert(0, args["code"])
    from inference.engine import Engine, GenerationRequest, SamplingParams
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from inference.serving.runner_main import warm_up

    # The product's slots (4 answering + 4 cached): one is kept for a person's first request.
    config = RunnerConfig(model_path=args["model"], ctx_per_seq=1024, parallel=4,
                          n_threads=args["threads"], use_extra_bufts=args["extra_bufts"])
    engine = Engine(LlamaRunner(config), itl_target=1.0).start()
    warm_up(engine)
    asking = VARIANTS[args["variant"]]
    try:
        batches = []
        for batch in range(args["batches"]):
            requests = []
            for n in range(4):
                extra = {"logprobs": 20} if n in asking else {}
                params = SamplingParams(temperature=0.0, max_tokens=args["steps"] + 1, **extra)
                prompt = (f"Note {args['salt'] + 10 * batch + n}. Count from 1 to 1000, "
                          "separated by commas: 1, 2, 3, 4, 5, 6, 7, 8,")  # greedy counts on
                requests.append(GenerationRequest(prompt, params))
            batches.append(rates(four_streams(engine, requests), asking))
    finally:
        engine.shutdown()
    return {key: statistics.median(b[key] for b in batches) for key in batches[0]}


def four_streams(engine, requests: list) -> list[list[float]]:
    """Submit the four together; each one's token times."""
    times: list[list[float]] = [[] for _ in requests]
    finished = [threading.Event() for _ in requests]

    def sink(n: int):
        def take(event) -> None:
            if event.type == "token":
                times[n].append(time.perf_counter())
            elif event.type in ("done", "error"):
                finished[n].set()

        return take

    for n, request in enumerate(requests):
        engine.submit(request, sink=sink(n))
    for event in finished:
        if not event.wait(600):
            raise RuntimeError("a stream did not finish")
    if any(len(t) < 16 for t in times):
        raise RuntimeError("a stream ended (end of generation) after fewer than 16 tokens")
    return times


def rates(times: list[list[float]], asking: tuple[int, ...]) -> dict:
    """Decode tok/s over the window where all four decode (the last one's first token to the
    first one's last): all four together, the first asking stream's own, and the mean of the
    others' own."""
    start, end = max(t[0] for t in times), min(t[-1] for t in times)
    if end <= start:
        raise RuntimeError("the four streams never decoded together")

    def rate(streams) -> float:
        return sum(1 for n in streams for t in times[n] if start < t <= end) / (end - start)

    others = [n for n in range(4) if n not in asking] or [0]
    return {"aggregate": rate(range(4)), "asker": rate(asking[:1] or [0]),
            "other": rate(others) / len(others)}  # fmt: skip


# --- the orchestrator --------------------------------------------------------------------------


def busy_cpu_seconds() -> float:
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_side(args: dict) -> tuple[dict, float]:
    """One side in a fresh interpreter; (its result, the share of the CPUs other processes used
    meanwhile)."""
    for _ in range(100):  # wait (30 s at most) for a quiet machine
        busy = busy_cpu_seconds()
        time.sleep(0.3)
        if (busy_cpu_seconds() - busy) / 0.3 / os.cpu_count() <= QUIET_SHARE:
            break
    wall, busy = time.perf_counter(), busy_cpu_seconds()
    before = os.times()
    done = subprocess.run([sys.executable, __file__, "--side", json.dumps(args)], cwd=args["code"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    after = os.times()
    wall = time.perf_counter() - wall
    ours = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)  # fmt: skip
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not results:
        raise RuntimeError(f"side {args['variant']} failed:\n{done.stdout}{done.stderr}"[-3000:])
    foreign = max(0.0, busy_cpu_seconds() - busy - ours) / wall / os.cpu_count()
    return json.loads(results[-1][len(RESULT_MARK) :]), foreign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--batches", type=int, default=2, help="batches of 4 streams per side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-extra-bufts", action="store_true")
    parser.add_argument("--model", help="a GGUF (default: the starter model)")
    parser.add_argument("--baseline", help="a checkout of the code before logprobs")
    options = parser.parse_args()
    if options.side:
        print(RESULT_MARK + json.dumps(side(json.loads(options.side))), flush=True)
        return 0
    sys.path.insert(0, str(ROOT))
    from inference.catalog.starter import starter_model_path

    common = {"model": options.model or str(starter_model_path()), "threads": options.threads,
              "extra_bufts": not options.no_extra_bufts, "steps": options.steps,
              "batches": options.batches}  # fmt: skip
    sides = [("baseline", options.baseline)] if options.baseline else []
    sides += [(variant, str(ROOT)) for variant in VARIANTS]
    rows: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for r in range(options.rounds):
        line = []
        # Each round starts with another side: a machine that drifts over a round (turbo,
        # page cache, another process) then favours none of them.
        for name, code in sides[r % len(sides) :] + sides[: r % len(sides)]:
            variant = "none" if name == "baseline" else name
            result, foreign = run_side({**common, "variant": variant, "code": code,
                                        "salt": 1000 * r})  # fmt: skip
            rows[name].append(result)
            note = f" (others used {foreign:.0%} of the CPUs)" if foreign > QUIET_SHARE else ""
            line.append(f"{name} {result['aggregate']:.1f}{note}")
        print(f"round {r}: 4-stream aggregate decode tok/s: " + ", ".join(line), flush=True)
    med = {name: {key: statistics.median(row[key] for row in got) for key in got[0]}
           for name, got in rows.items()}  # fmt: skip
    out = {f"{name}_tps": round(m["aggregate"], 2) for name, m in med.items()}
    out["one_top20_asker_tps"] = round(med["one_top20"]["asker"], 2)
    out["one_top20_other_tps"] = round(med["one_top20"]["other"], 2)
    out["one_top20_vs_none"] = round(med["one_top20"]["aggregate"] / med["none"]["aggregate"], 3)
    out["asker_vs_others"] = round(med["one_top20"]["asker"] / med["one_top20"]["other"], 3)
    out["all_top20_vs_none"] = round(med["all_top20"]["aggregate"] / med["none"]["aggregate"], 3)
    if "baseline" in med:
        out["none_vs_baseline"] = round(med["none"]["aggregate"] / med["baseline"]["aggregate"], 3)
        # The noise: the same ratio round by round (equal code would scatter as much).
        per_round = [n["aggregate"] / b["aggregate"] for n, b in zip(rows["none"],
                                                                     rows["baseline"], strict=True)]
        out["none_vs_baseline_range"] = [round(min(per_round), 3), round(max(per_round), 3)]
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
