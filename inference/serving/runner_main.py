"""A runner process: one loaded model, its engine, and nothing else. The only kind of process
that imports llama_cpp (through the runner factory it is told to use).

    python -m inference.serving.runner_main FD [--preload MODULE]

FD is this end of a socket pair its supervisor made (inference.serving.runner_process). The
runner reads Launch, loads the model, warms it up (so a CPU that cannot run this build's
kernels dies now, at load, and not in someone's answer), answers Ready, then serves:

1. the main thread reads Submit / Cancel / SetPriority / Embed / Tokenize / Detokenize /
   ForgetPrompts / SnapshotRequest / Shutdown, and answers each Submit and SnapshotRequest at
   once (a snapshot
   only reads counters: it never waits for a step); an Embed is checked and tokenized here and
   answered when the engine thread has computed it, between two steps; a Tokenize or
   Detokenize is checked here and answered when the engine thread has computed it (a Tokenize
   with images, when the encoder thread has read them, without encoding: count_tokens);
2. the engine thread sends every event of every request the moment it happens.

With warm memory on (Launch.prompt_cache), the runner keeps prompts in its tiers
(inference.engine.tiers): its disk tier is indexed before Ready, and when it stops (a Shutdown,
or its supervisor gone) what its idle slots hold goes into the RAM tier, the model is freed, and
only then is the RAM tier written to disk (at most PromptCacheConfig.flush_s): an unload costs
the next load nothing, and loses nothing.

When the supervisor goes away (its end of the connection closes), the runner stops: no runner
outlives the process that started it by more than that flush. It imports no Django.
"""

import importlib
import logging
import os
import sys
import threading
import time
from multiprocessing.connection import Connection

from inference.engine import Engine, Refused
from inference.engine.speculation.policy import Speculation
from inference.engine.tiers.config import open_store
from inference.serving import messages as m

log = logging.getLogger("inference.runner")


class Outbox:
    """The runner's half of the connection; sends from any thread, one message at a time."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: object) -> None:
        with self._lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the supervisor is gone; the main loop sees it too
                pass


def load_runner(launch: m.Launch):
    module, _, attribute = launch.runner_factory.partition(":")
    factory = getattr(importlib.import_module(module), attribute)
    return factory(launch.config)


def warm_up(engine: Engine) -> None:
    """The runner's warm-up decode, if it has one, on the engine's own thread (where every
    later decode runs: llama.cpp's OpenMP threads belong to the thread that calls it); then
    its calibration, the cost of steps by size (runner.calibrate, about 0.1 s), where a wrong
    guess costs: with speculation on, which weighs the sizes of steps; and on a GPU, where the
    step-cost model's priors (10 ms a step and 5 ms a token: a CPU's) would read the first long
    prompt beside a stream in chunks of a dozen tokens until its own steps taught it better.
    Calibrated steps carry logits at every position, so they overstate what a prompt chunk of
    that size costs: the first chunks err small, never into a stall."""
    warm = getattr(engine.runner, "warm_up", None)
    if warm is not None:
        engine.on_engine_thread(warm).result()
    calibrate = getattr(engine.runner, "calibrate", None)
    speculating = engine.speculation is not None and engine.speculation.enabled
    if calibrate is not None and (speculating or on_gpu(engine.runner.info())):
        for tokens, seconds in engine.on_engine_thread(calibrate).result():
            engine.budget.calibrate(tokens, seconds)


def on_gpu(info: dict) -> bool:
    """Whether llama.cpp put layers of this model on a GPU (LlamaRunner.info)."""
    return bool(info.get("gpu_offload")) and (info.get("gpu_layers") or 0) > 0


def embed(engine: Engine, message: m.Embed, outbox: Outbox) -> None:
    """Start an Embed; its answer goes out when the engine thread has computed it."""
    rid = message.request_id

    def failed(exc: BaseException) -> m.EmbedFailed:
        return m.EmbedFailed(rid, Refused.of(exc).refusal)

    def answer(future) -> None:
        exc = future.exception()
        outbox.send(failed(exc) if exc is not None else m.Embedded(rid, future.result()))

    try:
        future = engine.embed(message.inputs, truncate=message.truncate, query=message.query,
                              truncate_left=message.truncate_left)
    except Exception as exc:  # noqa: BLE001 - every refusal is an answer
        outbox.send(failed(exc))
    else:
        future.add_done_callback(answer)


def tokens(engine: Engine, message: m.Tokenize | m.Detokenize, outbox: Outbox) -> None:
    """Start a Tokenize or Detokenize; its answer goes out when the engine thread is done."""
    rid = message.request_id

    def failed(exc: BaseException) -> m.TokensFailed:
        return m.TokensFailed(rid, Refused.of(exc).refusal)

    def answered(result) -> object:
        if isinstance(message, m.Detokenize):
            return m.Detokenized(rid, result)
        return m.Tokenized(rid, result.ids, result.pieces)

    def answer(future) -> None:
        exc = future.exception()
        outbox.send(failed(exc) if exc is not None else answered(future.result()))

    try:
        if isinstance(message, m.Detokenize):
            future = engine.detokenize(list(message.tokens))
        else:
            future = engine.tokenize(message.text, add_special=message.add_special,
                                     parse_special=message.parse_special,
                                     with_pieces=message.with_pieces,
                                     images=message.images)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - every refusal is an answer
        outbox.send(failed(exc))
    else:
        future.add_done_callback(answer)


def forget(engine: Engine, message: m.ForgetPrompts, outbox: Outbox) -> None:
    """Start a ForgetPrompts; its answer goes out when the engine thread has done it."""

    def answer(future) -> None:
        entries = -1 if future.exception() is not None else future.result()
        outbox.send(m.PromptsForgotten(message.request_id, entries))

    engine.forget_prompts(message.partition, everything=message.everything).add_done_callback(
        answer
    )


def serve(conn: Connection, outbox: Outbox, engine: Engine) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            log.info("%s: the supervisor went away; stopping", engine.name)
            return
        if isinstance(message, m.Submit):
            rid = message.request.request_id
            try:
                engine.submit(message.request, load_time=message.load_time, sink=outbox.send)
            except Exception as exc:  # noqa: BLE001 - every refusal is an answer
                outbox.send(m.SubmitRefused(rid, Refused.of(exc).refusal))
            else:
                # Sent after submit returned: the Accepted can follow the request's first
                # events, which the supervisor buffers until it sees it.
                outbox.send(m.Accepted(rid))
        elif isinstance(message, m.Cancel):
            engine.cancel(message.request_id)
        elif isinstance(message, m.SetPriority):
            engine.set_priority(message.request_id, message.priority)
        elif isinstance(message, m.Embed):
            embed(engine, message, outbox)
        elif isinstance(message, m.Tokenize | m.Detokenize):
            tokens(engine, message, outbox)
        elif isinstance(message, m.ForgetPrompts):
            forget(engine, message, outbox)
        elif isinstance(message, m.SnapshotRequest):
            outbox.send(m.Snapshot(message.serial, engine.snapshot()))
        elif isinstance(message, m.Shutdown):
            engine.shutdown(timeout=message.timeout)
            outbox.send(m.Stopped())
            return


def run(conn: Connection) -> None:
    launch: m.Launch = conn.recv()
    logging.basicConfig(
        level=launch.log_level, format=f"%(levelname)s runner[{launch.name}] %(name)s: %(message)s"
    )
    outbox = Outbox(conn)
    started = time.perf_counter()
    engine = None
    try:
        runner = load_runner(launch)
        engine = Engine(
            runner, itl_target=launch.itl_target, max_queue=launch.max_queue,
            background_itl_target=launch.background_itl_target, name=launch.name,
            prompts=kept_prompts(launch, runner), speculation=speculation(launch),
        ).start()  # fmt: skip
        warm_up(engine)
    except Exception as exc:  # noqa: BLE001 - a clean refusal; a native fault kills us instead
        log.warning("loading %s failed: %s", launch.name, exc)
        outbox.send(m.LoadFailed(str(exc) or type(exc).__name__))
        if engine is not None:
            engine.shutdown(timeout=5)
        return
    outbox.send(m.Ready(engine.info(), time.perf_counter() - started, os.getpid()))
    try:
        serve(conn, outbox, engine)
    finally:
        engine.shutdown(timeout=5)  # a no-op after a Shutdown; the runner closes once
        if launch.prompt_cache is not None:
            written = engine.persist_prompts(launch.prompt_cache.flush_s)
            if written:
                log.info("%s: %d kept prompts written to disk", launch.name, written)


def speculation(launch: m.Launch) -> Speculation:
    """The box's mode (SPECULATIVE_DECODING), turned off where the model's setting says so."""
    mode = launch.speculative
    if getattr(launch.config, "speculative", "auto") == "off":
        mode = "off"
    return Speculation(mode)


def kept_prompts(launch: m.Launch, runner):
    """The runner's tiers (inference.engine.tiers), or None: warm memory off, or a runner
    without save and restore. A disk tier that cannot be opened leaves RAM only."""
    if launch.prompt_cache is None or not hasattr(runner, "save"):
        return None
    try:
        return open_store(launch.prompt_cache, launch.config, runner)
    except Exception as exc:  # noqa: BLE001 - serving without warm memory beats not serving
        log.warning("%s: kept prompts are off: %s", launch.name, exc)
        return None


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[1]))
    if "--preload" in argv:
        # A spare runner (RunnerSupervisor): what a load imports first, done before it is
        # asked for one, so a load started in it skips an interpreter's start and its imports.
        importlib.import_module(argv[argv.index("--preload") + 1])
    try:
        run(conn)
    except EOFError:  # a spare let go of without a Launch
        pass
    finally:
        conn.close()


if __name__ == "__main__":
    main(sys.argv)
