"""Engine sides: the engine driven in-process, in a process of its own (`python -m bench.side
NAME ARGS`), one engine configuration per process, no raw llama.cpp user beside it."""

import statistics
import threading
import time

from bench.measure import client_side, greedy
from bench.prompts import FOLLOW_UP, make_tokens
from inference.engine import Engine
from inference.engine import GenerationRequest as ask  # noqa: N813
from inference.engine.runner import LlamaRunner
from inference.engine.runner_config import RunnerConfig
from inference.engine.speculation.policy import Speculation
from inference.engine.tiers import PromptStore
from inference.serving.runner_main import warm_up


def start_engine(args: dict, **engine_kwargs) -> Engine:
    """The engine on a fresh runner, warmed up as a runner process does it
    (inference.serving.runner_main.warm_up: LlamaRunner.warm_up on the engine thread, where
    every later llama_decode runs; bench/warmup_thread.py shows why the thread matters).
    `args["product"]`: with what a runner process adds, warm memory (a RAM tier) and, when it
    names a mode, speculation ("off", "auto")."""
    runner = LlamaRunner(RunnerConfig(**args["config"]))
    product = args.get("product")
    if product:
        engine_kwargs.setdefault("prompts", PromptStore(4 << 30))
        if product != "off":
            engine_kwargs.setdefault("speculation", Speculation(product))
    engine = Engine(runner, itl_target=args["itl_target"], max_queue=64, **engine_kwargs).start()
    warm_up(engine)
    return engine


class Recorder:
    """A request's events as the engine sends them (its sink runs on the engine thread), with
    the time of each token."""

    def __init__(self, on_token=None):
        self.times: list[float] = []
        self.final = None
        self.finished = threading.Event()
        self.on_token = on_token

    def __call__(self, event) -> None:
        if event.type == "token":
            self.times.append(time.perf_counter())
            if self.on_token is not None:
                self.on_token(len(self.times))
        elif event.type in ("done", "error"):
            self.final = event
            self.finished.set()

    def wait(self, timeout: float = 600):
        if not self.finished.wait(timeout):
            raise RuntimeError("the engine did not finish the request in time")
        if self.final.type != "done":
            raise RuntimeError(f"engine request failed: {self.final.message}")
        return self.final


def run(engine: Engine, prompt, max_tokens: int, **submit_kwargs):
    recorder = Recorder()
    engine.submit(ask(prompt, greedy(max_tokens), **submit_kwargs), sink=recorder)
    return recorder.wait()


def side_engine_basic(args: dict) -> dict:
    """Prefill tok/s (a fresh 512-token prompt, max_tokens 1), single-stream decode tok/s and
    4-stream aggregate decode tok/s, each the median over a few requests."""
    engine = start_engine(args)
    tok = engine.runner.tokenize
    try:
        prefill, short = [], []
        for salt in args["prefill_salts"]:
            done = run(engine, make_tokens(tok, args["prefill_tokens"], salt), max_tokens=1)
            prefill.append(done.figures["prompt_tps"])
        decode = []
        for salt in args["decode_salts"]:
            done = run(engine, make_tokens(tok, 32, salt), max_tokens=args["decode_steps"] + 1)
            decode.append(done.figures["decode_tps"])
            short.append(done.figures["output_tokens"] < args["decode_steps"] + 1)
        batch4 = []
        for salt in args["batch4_salts"]:
            aggregate, ended_early = four_streams(engine, [make_tokens(tok, 32, salt + i)
                                                           for i in range(4)],
                                                  args["batch4_steps"])  # fmt: skip
            batch4.append(aggregate)
            short.append(ended_early)
    finally:
        engine.shutdown()
    return {"prefill_tps": statistics.median(prefill), "decode_tps": statistics.median(decode),
            "batch4_tps": statistics.median(batch4), "ended_early": any(short)}  # fmt: skip


def four_streams(engine: Engine, prompts: list[list[int]], steps: int) -> tuple[float, bool]:
    """Aggregate decode tok/s of streams submitted together, counted while all of them decode:
    from the last stream's first token to the first stream's last one (the window where the
    raw baseline's batched steps run). The engine may admit them a step apart."""
    recorders = [Recorder() for _ in prompts]
    for prompt, recorder in zip(prompts, recorders, strict=True):
        engine.submit(ask(prompt, greedy(steps + 1)), sink=recorder)
    finals = [r.wait() for r in recorders]
    start = max(r.times[0] for r in recorders)
    end = min(r.times[-1] for r in recorders)
    produced = sum(1 for r in recorders for t in r.times if start < t <= end)
    ended_early = any(f.figures["output_tokens"] < steps + 1 for f in finals)
    return produced / (end - start), ended_early


def stall_once(engine: Engine, tok, args: dict, salt: int) -> dict:
    """A decodes; B (fresh tokens) arrives after A's 8th token. A's longest gap between two
    tokens sent while B waited for its first token, B's TTFT with A, and B's TTFT alone."""
    b_prompt = make_tokens(tok, args["b_tokens"], salt)
    b_started = threading.Event()
    a = Recorder(on_token=lambda n: n == args["a_warm_tokens"] and b_started.set())
    a_limit = engine.runner.ctx_per_seq - args["a_tokens"] - 1
    a_prompt = make_tokens(tok, args["a_tokens"], salt + 2)
    a_handle = engine.submit(ask(a_prompt, greedy(a_limit)), sink=a)
    if not b_started.wait(120):
        raise RuntimeError("stream A did not start")
    b_accepted, b_arrived = time.perf_counter(), time.time()
    b = run(engine, b_prompt, max_tokens=2, arrived_wall=b_arrived)
    b_first = b_accepted + b.figures["ttft"]
    a_running = not a.finished.is_set()
    engine.cancel(a_handle.id)
    a.finished.wait(60)
    gaps = [later - earlier for earlier, later in zip(a.times, a.times[1:], strict=False)
            if later >= b_accepted and earlier <= b_first]  # fmt: skip
    alone = run(engine, make_tokens(tok, args["b_tokens"], salt + 3), max_tokens=2)
    chunks = sum(1 for p in b.figures["timeline"] if p["phase"] == "prefill")
    return {"a_itl_max_s": max(gaps) if gaps else 0.0, "b_ttft_with_a_s": b.figures["ttft"],
            "b_ttft_alone_s": alone.figures["ttft"], "a_ran_throughout": a_running,
            "b_chunks": chunks, "a_itl_p50_s": statistics.median(gaps) if gaps else 0.0,
            "a_gaps": len(gaps),
            "a_gaps_over_target": sum(g > engine.itl_target * 1.1 for g in gaps)}  # fmt: skip


def side_engine_stall(args: dict) -> dict:
    """The stall scenario once unmeasured (the step-cost model learns this machine's mixed
    steps, as in an engine that has been serving), then once measured."""
    engine = start_engine(args, chunked_prefill=args["chunked"], prefix_cache=False)
    try:
        if args["warm"]:
            stall_once(engine, engine.runner.tokenize, args, args["salt"] + 50)
        result = stall_once(engine, engine.runner.tokenize, args, args["salt"])
        result["step_cost"] = engine.snapshot()["step_cost"]
        result["token_budget_1"] = engine.budget.tokens(1)
    finally:
        engine.shutdown()
    return result


def side_engine_prefix(args: dict) -> dict:
    """Second-turn TTFT over a history: the first turn (history → 16 tokens), then the history,
    the answer and a follow-up question, with the prefix cache on or off."""
    engine = start_engine(args, prefix_cache=args["prefix_cache"])
    tok = engine.runner.tokenize
    try:
        run(engine, make_tokens(tok, args["history_tokens"], args["salt"] + 50), max_tokens=2)
        history = make_tokens(tok, args["history_tokens"], args["salt"])
        first = run(engine, history, max_tokens=16)
        turn2 = history + tok(first.text, False) + tok(FOLLOW_UP, False)
        second = run(engine, turn2, max_tokens=2)
    finally:
        engine.shutdown()
    f = second.figures
    return {"ttft_s": f["ttft"], "cached_tokens": f["cached_tokens"],
            "prompt_tokens": f["prompt_tokens"]}  # fmt: skip


def side_ipc_engine(args: dict) -> dict:
    """The IPC comparison's in-process side: the same requests as ipc_runner, read by the
    caller from the handle, with the engine in this process (as runner_main builds it)."""
    engine = start_engine(args)
    try:
        return client_side(engine, args)
    finally:
        engine.shutdown()



def side_engine_flood(args: dict) -> dict:
    """A person's TTFT alone, then during another app's flood of `flood` streams (each one that
    ends replaced at once, as an app working through a folder keeps them going): the person's
    requests one after another with a pause between, and the flood's output tok/s meanwhile.
    `policy`: "fifo" (everyone one anonymous share, no slot in reserve: admission as it was
    before fair share), "default" (the app's key interactive, the default) or "background"."""
    fifo = args["policy"] == "fifo"
    engine = start_engine(args, prefix_cache=False, **({"reserve": 0} if fifo else {}))
    tok = engine.runner.tokenize
    person = {} if fifo else {"share": "user:5"}
    app = {} if fifo else {"share": "apikey:3"}
    if args["policy"] == "background":
        app["priority"] = "background"
    produced: list[float] = []  # when each of the flood's tokens was sent
    salts = iter(range(args["salt"] + 1000, args["salt"] + 1_000_000))
    stop = threading.Event()

    def flood_one() -> None:
        recorder = Recorder(on_token=lambda n: produced.append(time.perf_counter()))

        def sink(event) -> None:  # on the engine thread: the next document as one ends
            recorder(event)
            if recorder.finished.is_set() and not stop.is_set():
                flood_one()

        prompt = make_tokens(tok, args["flood_tokens"], next(salts))
        engine.submit(ask(prompt, greedy(args["flood_out"]), **app), sink=sink)

    def ask_person(salt: int) -> dict:
        prompt = make_tokens(tok, args["person_tokens"], salt)
        return run(engine, prompt, args["person_out"], **person).figures

    try:
        alone = [ask_person(args["salt"] + i)["ttft"] for i in range(args["persons"])]
        for _ in range(args["flood"]):
            flood_one()
        time.sleep(args["settle_s"])  # the flood's first prompts read, its streams decoding
        started = time.perf_counter()
        during = []
        for i in range(args["persons"]):
            during.append(ask_person(args["salt"] + 500 + i))
            time.sleep(args["gap_s"])
        ended = time.perf_counter()
        stop.set()
    finally:
        engine.shutdown()
    return {"ttft_alone_s": statistics.median(alone),
            "ttft_during_s": statistics.median([f["ttft"] for f in during]),
            "ttft_during_max_s": max(f["ttft"] for f in during),
            "itl_p99_during_s": max(f["itl"]["p99"] or 0.0 for f in during),
            "flood_output_tps": sum(started <= t <= ended for t in produced) / (ended - started)}


def side_engine_flood_alone(args: dict) -> dict:
    """The flood alone, as bench/raw.py's side_raw_flood runs it: the same documents submitted
    at once by one app whose key is background (nobody reads them, so no ITL target binds), and
    the engine's output and prompt tok/s over the whole flood."""
    engine = start_engine(args, prefix_cache=False)
    tok = engine.runner.tokenize
    prompts = [make_tokens(tok, args["flood_tokens"], args["salt"] + i)
               for i in range(args["flood"])]  # fmt: skip
    recorders = [Recorder() for _ in prompts]
    try:
        started = time.perf_counter()
        for prompt, recorder in zip(prompts, recorders, strict=True):
            engine.submit(ask(prompt, greedy(args["flood_out"]), share="apikey:3",
                              priority="background"), sink=recorder)  # fmt: skip
        finals = [r.wait() for r in recorders]
        elapsed = time.perf_counter() - started
    finally:
        engine.shutdown()
    output = sum(f.figures["output_tokens"] for f in finals)
    return {"output_tps": output / elapsed, "prompt_tps": sum(map(len, prompts)) / elapsed,
            "seconds": elapsed, "output_tokens": output,
            "ended_early": any(f.figures["output_tokens"] < args["flood_out"] for f in finals)}
