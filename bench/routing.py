"""Benchmark: several inference workers on one Redis, with and without the router (issue 17).

    python bench/routing.py [--conversations 6] [--turns 4] [--max-tokens 16] [--threads 1]
                            [--rounds 2]

Split mode for real on loopback: Redis (database 13, flushed), inference worker processes as
docker-compose.yml starts them, and a SplitClient in this process (the web side's client).
Three setups, each with fresh workers and the starter model loaded once beforehand:

  one worker          the baseline
  two, shared queue   the old way: every request published to the shared queue "inference",
                      taken by whichever worker asks first (the router bypassed)
  two, routed         the router (inference.serving.routing)

In each, N conversations of T turns run at once (a turn is sent when the previous answer has
ended; chat apps resend the whole history), with a sequence slot each (parallel = N), so a turn
never waits for another's answer. For turns 2..T it reports the share that reused their
conversation's KV (cached tokens > 0 in the done event's figures) and their TTFT p50 as the
client saw it, pooled over rounds (the setups interleaved, so machine noise hits all alike),
against the issue's goals: >= 95 % reuse, TTFT p50 within 1.2x of one worker's. Also: how many
copies of the model were loaded (one unless load called for a second).

One llama.cpp thread per worker (--threads): the workers stand for boxes of their own, and two
2-thread teams on a 2-core machine would measure oversubscription, not routing.

The figures need a quiet machine (run it under the CPU lock on a shared box).
"""

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/13"
CELERY = Path(sys.executable).with_name("celery")


def _django() -> None:
    os.environ["REDIS_URL"] = REDIS_URL
    os.environ.setdefault("APPLIANCE_DATA_DIR", tempfile.mkdtemp(prefix="bench-routing-web-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "appliance.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import logging

    logging.getLogger("inference.serving.split_client").setLevel(logging.WARNING)  # per request


class Worker:
    def __init__(self, label: str, workdir: Path):
        self.label, self.workdir = label, workdir
        self.process: subprocess.Popen | None = None

    def start(self) -> "Worker":
        data = self.workdir / self.label
        data.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "REDIS_URL": REDIS_URL, "APPLIANCE_DATA_DIR": str(data),
               "MODELS_DIR": str(data / "models"), "DJANGO_SETTINGS_MODULE": "appliance.settings",
               "DATABASE_URL": "sqlite:////nonexistent/no-database.sqlite3"}  # fmt: skip
        env.pop("WORKER_NAME", None)
        self.log = open(self.workdir / f"{self.label}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(CELERY), "-A", "appliance", "worker", "-Q", "inference", "-P", "threads", "-c",
             "16", "--without-heartbeat", "--without-mingle", "--without-gossip",
             "-n", f"{self.label}@%h", "-l", "warning"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def _turn(history: str, n: int, conversation: int, max_tokens: int):
    from inference.engine import GenerationRequest, SamplingParams

    text = f"Conversation {conversation}, question {n}: name an animal and a colour."
    prompt = f"{history}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return GenerationRequest(prompt, params, model="smollm2-135m-instruct",
                             cache_key=f"bench-conversation-{conversation}")  # fmt: skip


async def _conversation(client, spec, c: int, turns: int, max_tokens: int) -> list[dict]:
    history, rows = "", []
    for n in range(1, turns + 1):
        request = _turn(history, n, c, max_tokens)
        sent = time.perf_counter()
        ttft = None
        async for event in client.stream(request, spec):
            if event["type"] == "token" and ttft is None:
                ttft = time.perf_counter() - sent
            if event["type"] in ("done", "error"):
                final = event
        if final["type"] != "done":
            raise RuntimeError(f"conversation {c} turn {n}: {final}")
        rows.append(
            {
                "turn": n,
                "ttft": ttft,
                "cached": final["figures"].get("cached_tokens", 0),
                "worker": final["route"]["worker"],
                "reason": final["route"]["reason"],
            }
        )
        history = request.prompt + final["text"] + "<|im_end|>\n"
    return rows


async def _setup(name: str, workers: int, routed: bool, args, spec, workdir: Path) -> dict:
    import redis

    from inference.serving import split_protocol as protocol
    from inference.serving.routing import SHARED_QUEUE, Route
    from inference.serving.split_client import SplitClient

    redis.Redis.from_url(REDIS_URL).flushdb()
    started = [Worker(f"bench{n}-{os.getpid()}", workdir).start() for n in range(workers)]
    try:
        client = SplitClient(REDIS_URL)
        deadline = time.monotonic() + 180
        while len(client.announcements()) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not announce themselves within 180 s")
            await asyncio.sleep(0.5)
        if not routed:  # the old way: one shared queue, whoever asks first
            client.choose = lambda *a, **k: Route(None, protocol.QUEUE, SHARED_QUEUE)
        await client.load(spec)  # on one worker (routed), on every worker (the old way)
        await asyncio.sleep(1.5)  # the load is announced
        conversations = await asyncio.gather(*(
            _conversation(client, spec, c, args.turns, args.max_tokens)
            for c in range(args.conversations)
        ))  # fmt: skip
        loaded = {a.worker: [m.name for m in a.loaded] for a in client.announcements()}
    finally:
        for worker in started:
            worker.stop()
    later = [row for rows in conversations for row in rows if row["turn"] > 1]
    reused = sum(1 for row in later if row["cached"] > 0)
    return {
        "setup": name, "later_turns": len(later), "reused": reused,
        "ttfts": [row["ttft"] for row in later],
        "copies": sum(len(models) for models in loaded.values()),
        "workers_used": len({row["worker"] for rows in conversations for row in rows}),
        "reasons": sorted({row["reason"] for row in later}),
    }  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per worker")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    _django()
    from inference.catalog.starter import starter_model_path
    from inference.engine.host import ModelSpec
    from inference.engine.runner_config import RunnerConfig
    from inference.serving.model_index import _sha256

    path = starter_model_path()
    config = RunnerConfig(
        str(path),
        ctx_per_seq=1024,
        parallel=args.conversations,
        cache_slots=args.conversations,
        n_threads=args.threads,
    )
    spec = ModelSpec("smollm2-135m-instruct", config, keep_alive=-1, sha256=_sha256(str(path)))
    workdir = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    setups = (("one worker", 1, True), ("two, shared queue", 2, False), ("two, routed", 2, True))
    results: dict[str, dict] = {}
    for n in range(args.rounds):
        for name, workers, routed in setups:
            got = await _setup(name, workers, routed, args, spec, workdir)
            print(f"round {n + 1} {name:18} turns 2-{args.turns} reusing their KV: "
                  f"{got['reused']} of {got['later_turns']}; their TTFT p50 "
                  f"{statistics.median(got['ttfts']) * 1000:.0f} ms; model copies "
                  f"{got['copies']}; workers used {got['workers_used']}; routes "
                  f"{', '.join(got['reasons'])}", flush=True)  # fmt: skip
            pooled = results.setdefault(name, {"reused": 0, "later_turns": 0, "ttfts": [],
                                               "copies": 0})  # fmt: skip
            pooled["reused"] += got["reused"]
            pooled["later_turns"] += got["later_turns"]
            pooled["ttfts"] += got["ttfts"]
            pooled["copies"] = max(pooled["copies"], got["copies"])
    base = statistics.median(results["one worker"]["ttfts"])
    print(f"one worker         TTFT p50 of later turns {base * 1000:.0f} ms "
          f"({args.rounds} rounds)")  # fmt: skip
    for name in ("two, shared queue", "two, routed"):
        result = results[name]
        share = result["reused"] / result["later_turns"]
        ratio = statistics.median(result["ttfts"]) / base
        print(f"{name:18} reuse {result['reused']} of {result['later_turns']} = {share:.0%} "
              f"(goal >= 95 %: {'met' if share >= 0.95 else 'NOT met'}); TTFT p50 {ratio:.2f}x "
              f"one worker's (goal <= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'}); "
              f"copies of the model {result['copies']}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
