"""Benchmark: speculative decoding (issue 25), the appliance against llama-server, served.

    python bench/speculation.py --llama-server PATH [--rounds 3] [--threads 2] [--max-tokens 240]

One stream at a time, greedy, up to --max-tokens tokens, three tasks: an edit that copies a
paragraph back with one word changed, a JSON list of the devices its prompt names, and free
prose. Sides, each a server started fresh in processes of its own for each measurement, in an
order turned every round: the appliance with SPECULATIVE_DECODING off and auto (its default),
llama-server without speculation and with each of its n-gram types (ngram-simple, ngram-map-k,
ngram-mod; the llama.cpp that llama-cpp-python vendors: see bench/versus_server.py). The client
is this process: a task's decode rate is (tokens - 1) / (last token - first token), its answer's
text is compared with the same side's without speculation. Figures are medians over rounds.

It prints a line per measurement, the goals (issue 25) and last ONE JSON line.
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

from bench.http_load import Target  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

PARAGRAPH = ("The kitchen light is blue. The hall light is blue and bright. In the garage the "
             "light is blue as well, and the attic has a blue lamp next to the window. The "
             "porch lamp is blue too, and so is the small light above the cellar stairs.")
TASKS = {
    "edit": "Repeat this text exactly, but write green instead of blue:\n" + PARAGRAPH,
    "json": "The devices are: kitchen light, hall light, garage door, attic fan, porch lamp, "
            "cellar pump, office heater, bedroom blinds. Answer with a JSON array of objects "
            "with the keys name and room, one for each device.",
    "prose": "Write a short story about the sea.",
}  # fmt: skip
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")


def log(message: str) -> None:
    print(message, flush=True)


async def stream(target: Target, content: str, max_tokens: int) -> dict:
    body = {"model": target.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
    times, text, timings = [], "", {}
    async with httpx.AsyncClient(timeout=600) as client:
        async with client.stream("POST", f"{target.url}/v1/chat/completions", json=body,
                                 headers=target.headers["person"]) as response:  # fmt: skip
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        times.append(time.perf_counter())
                        text += piece
    tokens = int(timings.get("predicted_n") or len(times))
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"tps": (tokens - 1) / span if span > 0 else None, "text": text, "tokens": tokens,
            "draft_n": timings.get("draft_n"),
            "draft_n_accepted": timings.get("draft_n_accepted")}  # fmt: skip


def measure(server: Server, max_tokens: int) -> dict:
    target = server.start()
    try:
        asyncio.run(stream(target, "Say hello.", 4))  # warm-up: the model loaded, its kernels run
        return {task: asyncio.run(stream(target, prompt, max_tokens))
                for task, prompt in TASKS.items()}  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=240)
    args = parser.parse_args()
    if not os.access(args.llama_server, os.X_OK):
        sys.exit(f"{args.llama_server} is not an executable llama-server")
    sides: dict[str, Server] = {
        "appliance off": Appliance(args.threads, {"SPECULATIVE_DECODING": "off"}),
        "appliance auto": Appliance(args.threads, {"SPECULATIVE_DECODING": "auto"}),
        "llama-server none": LlamaServer(args.llama_server, args.model, args.threads, 1, 8192),
        **{f"llama-server {kind}": LlamaServer(args.llama_server, args.model, args.threads, 1,
                                               8192, ("--spec-type", kind))
           for kind in NGRAM_TYPES},
    }  # fmt: skip
    rows: dict[tuple[str, str], list[dict]] = {}
    started = time.perf_counter()
    try:
        for server in sides.values():
            server.setup()
        for r in range(args.rounds):
            order = list(sides.items())
            order = order[r % len(order):] + order[: r % len(order)]
            for name, server in order:
                result = measure(server, args.max_tokens)
                for task, row in result.items():
                    rows.setdefault((name, task), []).append(row)
                log(f"  round {r} {name}: " + ", ".join(
                    f"{task} {row['tps'] or 0:.1f} tok/s"
                    + (f" ({row['draft_n_accepted']} of {row['draft_n']} drafts kept)"
                       if row.get("draft_n") else "")
                    for task, row in result.items()))  # fmt: skip
    finally:
        for server in sides.values():
            server.close()

    def tps(name: str, task: str) -> float:
        return statistics.median(row["tps"] or 0.0 for row in rows[name, task])

    results: dict = {}
    for task in TASKS:
        for name in sides:
            results[f"{task}_tps_{name.replace(' ', '_')}"] = tps(name, task)
        server_best = max(tps(name, task) for name in sides if name.startswith("llama-server"))
        results[f"{task}_ratio_to_best_llama_server"] = tps("appliance auto", task) / server_best
        results[f"{task}_speculation_gain"] = tps("appliance auto", task) / tps("appliance off",
                                                                               task)  # fmt: skip
        for family, plain in (("appliance", "appliance off"),
                              ("llama-server", "llama-server none")):  # fmt: skip
            reference = rows[plain, task][0]["text"]
            changed = [name for name in sides if name.startswith(family) and name != plain
                       and any(row["text"] != reference for row in rows[name, task])]
            results[f"{task}_changed_answers_{family}"] = changed
    log(f"goals ({time.perf_counter() - started:.0f} s in all):")
    for task, goal in (("edit", 1.0), ("json", 1.0)):
        value = results[f"{task}_ratio_to_best_llama_server"]
        log(f"  {task}: appliance auto {value:.3f}x the best llama-server: goal ≥ {goal}: "
            f"{'met' if value >= goal else 'NOT met'}")  # fmt: skip
    prose = results["prose_speculation_gain"]
    log(f"  prose: auto {prose:.3f}x off: goal ≥ 0.97: {'met' if prose >= 0.97 else 'NOT met'}")
    for task in TASKS:
        log(f"  {task}: answers changed by speculation: appliance "
            f"{results[f'{task}_changed_answers_appliance'] or 'none'}, llama-server "
            f"{results[f'{task}_changed_answers_llama-server'] or 'none'}")  # fmt: skip
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
