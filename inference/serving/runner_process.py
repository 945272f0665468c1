"""The supervisor's side of one runner process: an engine that lives in another process.

RunnerProcess has the interface EngineHost needs of an engine (submit, busy, alive,
last_active, info, snapshot, shutdown), so the host keeps models in runner processes exactly
as it kept in-process engines. Behind it:

- the runner is `python -m inference.serving.runner_main FD`, a fresh interpreter (not a fork
  of a process with threads and an event loop), talking over a socket pair;
- a reader thread takes every message off the connection: engine events go to their request's
  RequestHandle, so callers read events exactly as from an in-process engine, and the answer
  to an Embed settles the Future that `embed()` returned, and the answer to a Tokenize or
  Detokenize the Future that `tokenize()` or `detokenize()` returned;
- when the connection ends without a Shutdown (the runner died: any signal, any exit), every
  request it held ends at once with an ErrorEvent that says how ("killed by signal 11 (SIGSEGV)
  during decode"), and `exit` records it for the supervisor.

`shutdown()` returns once the runner says Stopped (its engine stopped, its model freed) and has
had STOP_GRACE_S to exit: a runner still writing its kept prompts to disk then exits by itself
(runner_main; the reader records the exit), so an unload never waits for that flush.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from inference.engine import EngineStopped, GenerationRequest
from inference.engine.events import ErrorEvent, Event, PhaseEvent, RequestHandle, is_final
from inference.engine.generation import PRIORITIES, Priority
from inference.engine.media import Image
from inference.engine.refusals import Refusal, RefusalKind, Refused
from inference.engine.tiers.config import PromptCacheConfig
from inference.engine.tokens import Tokens
from inference.serving import messages as m

log = logging.getLogger(__name__)

DEFAULT_RUNNER_FACTORY = "inference.engine.runner:LlamaRunner"
LOAD_TIMEOUT_S = 600.0  # a large model from a slow disk takes minutes
SUBMIT_TIMEOUT_S = 30.0  # the runner answers a submit after tokenizing the prompt
SNAPSHOT_TIMEOUT_S = 0.5
STOP_GRACE_S = 2.0  # after Stopped: what a stop waits for the process to exit
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class RunnerLoadError(Refused, RuntimeError):
    """The runner could not load the model (llama.cpp refused it, or the runner died)."""

    kind = RefusalKind.LOAD_FAILED

    def __init__(self, message: str, exit: "RunnerExit | None" = None):
        super().__init__(message)
        self.exit = exit


@dataclass(slots=True, frozen=True)
class RunnerExit:
    """How a runner process ended."""

    returncode: int | None
    phase: str  # what it was doing: "load", "prefill", "decode", "idle", "shutdown"
    requested: bool  # the supervisor asked it to stop
    at: float  # wall clock

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def reason(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "unknown"
            how = f"killed by signal {self.signal} ({name})"
        elif self.returncode is None:
            how = "stopped answering"
        else:
            how = f"exited with status {self.returncode}"
        return how if self.requested else f"{how} {_WHILE[self.phase]}"

    def sentence(self, name: str) -> str:
        """"the runner for NAME was killed by signal 11 (SIGSEGV) during decode"."""
        verb = "was " if self.signal is not None else ""
        return f"the runner for {name} {verb}{self.reason}"


_WHILE = {
    "load": "during load", "prefill": "during prefill", "decode": "during decode",
    "queue": "with requests queued", "idle": "while idle", "shutdown": "during shutdown",
}  # fmt: skip


@dataclass(slots=True)
class Spawned:
    """A runner interpreter and the supervisor's end of its connection, before its Launch."""

    process: subprocess.Popen
    conn: Connection

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def discard(self) -> None:
        self.conn.close()  # a spare reads EOF instead of a Launch, and exits
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def spawn(preload: str = "") -> Spawned:
    """A fresh runner interpreter (`python -m inference.serving.runner_main FD`), waiting for its
    Launch. `preload`: a module it imports meanwhile (a spare runner: SPARE_PRELOAD)."""
    parent, child = socket.socketpair()
    env = dict(os.environ)
    # The project root first: the runner imports the same code as this process.
    paths = [str(PROJECT_ROOT), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    command = [sys.executable, "-m", "inference.serving.runner_main", str(child.fileno())]
    try:
        process = subprocess.Popen(
            command + (["--preload", preload] if preload else []),
            pass_fds=(child.fileno(),), env=env, cwd=str(PROJECT_ROOT),
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    finally:
        child.close()
    return Spawned(process, Connection(parent.detach()))


class _Pending:
    """A submit waiting for the runner's Accepted or SubmitRefused."""

    __slots__ = ("done", "refusal")

    def __init__(self):
        self.done = threading.Event()
        self.refusal: Refusal | None = None


class RunnerProcess:
    def __init__(
        self,
        name: str,
        config: object,
        *,
        itl_target: float = 0.1,
        background_itl_target: float = 1.0,
        max_queue: int = 64,
        runner_factory: str = DEFAULT_RUNNER_FACTORY,
        load_timeout: float = LOAD_TIMEOUT_S,
        log_level: str | None = None,
        prompt_cache: PromptCacheConfig | None = None,
        speculative: str = "auto",
    ):
        self.name = name
        self.config = config
        self.launch = m.Launch(
            name, config, runner_factory, itl_target, max_queue,
            log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            background_itl_target=background_itl_target, prompt_cache=prompt_cache,
            speculative=speculative,
        )  # fmt: skip
        self.load_timeout = load_timeout
        self.on_exit: Callable[[RunnerProcess, RunnerExit], None] | None = None
        self.exit: RunnerExit | None = None
        self.pid: int | None = None
        self.load_seconds = 0.0
        self.answered = 0  # requests that ended with "done": the runner really works here
        self.last_active = time.perf_counter()
        self._info: dict = {}
        self._snapshot: dict = {}  # the latest answer to a SnapshotRequest
        self._snapshot_serial = 0
        self._snapshot_waits: dict[int, threading.Event] = {}
        self._conn: Connection | None = None
        self._proc: subprocess.Popen | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards the tables below
        self._handles: dict[str, RequestHandle] = {}
        self._phases: dict[str, str] = {}
        self._pending: dict[str, _Pending] = {}
        self._early: dict[str, list[Event]] = {}  # events that overtook their Accepted
        self._embeds: dict[str, Future] = {}  # Embeds sent and not yet answered
        self._token_asks: dict[str, Future] = {}  # Tokenizes and Detokenizes not yet answered
        self._forgets: dict[str, Future] = {}  # ForgetPrompts not yet answered
        self._stopped = threading.Event()  # Stopped arrived, or the connection ended
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._load_failure: str | None = None
        self._stopping = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, spare: "Spawned | None" = None) -> "RunnerProcess":
        """Start the runner (in `spare`, an interpreter started beforehand, when given and
        still alive) and wait until the model is loaded. Raises RunnerLoadError."""
        spawned = spare if spare is not None and spare.alive else spawn()
        self._proc, self._conn = spawned.process, spawned.conn
        self.pid = self._proc.pid
        self._send(self.launch)
        self._reader = threading.Thread(target=self._read, name=f"runner-{self.name}", daemon=True)
        self._reader.start()
        if not self._ready.wait(self.load_timeout):
            self._kill()
            raise RunnerLoadError(f"{self.name}: the runner did not load within "
                                  f"{self.load_timeout:.0f} s")  # fmt: skip
        if self._load_failure is not None:
            raise RunnerLoadError(self._load_failure)
        if self.exit is not None:
            raise RunnerLoadError(self.exit.sentence(self.name), self.exit)
        log.info("runner for %s is up (pid %s, %.2f s)", self.name, self.pid, self.load_seconds)
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the runner (its requests end with an error); the memory returns to the OS."""
        with self._lock:
            self._stopping = True
        if self._proc is None:
            return
        if self.exit is None:
            self._send(m.Shutdown(timeout))
        if not self._stopped.wait(timeout + 5):
            log.warning("runner for %s did not stop; killing it", self.name)
            self._kill()
            self._proc.wait(5)
        try:
            self._proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.info("runner for %s stopped; it exits once its kept prompts are on disk",
                     self.name)  # fmt: skip
            return
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(10)  # its exit record and callbacks are done when this returns

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    # --- requests ----------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, *, load_time: float = 0.0) -> RequestHandle:
        """Queue a request in the runner; raises a Refused of the kind Engine.submit's refusal
        had, at once."""
        request_id = request.request_id
        handle = RequestHandle(request_id, self.cancel, set_priority=self.set_priority)
        pending = _Pending()
        with self._lock:
            if not self.alive:
                raise EngineStopped(self._stopped_message())
            if request_id in self._handles or request_id in self._pending:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._pending[request_id] = pending
            self._handles[request_id] = handle
            self._phases[request_id] = "waiting"
        self._send(m.Submit(request, load_time))
        if not pending.done.wait(SUBMIT_TIMEOUT_S):
            self._forget(request_id)
            raise EngineStopped(f"the runner for {self.name} did not answer")
        if pending.refusal is not None:
            self._forget(request_id)
            raise pending.refusal.error()
        if self.exit is not None and handle.final is None:  # died between accept and here
            handle.deliver(self._death_event(request_id))
        return handle

    def cancel(self, request_id: str) -> None:
        self._send(m.Cancel(request_id))

    def set_priority(self, request_id: str, priority: Priority) -> None:
        """Engine.set_priority in the runner. Checked here, as the engine checks it: a priority
        that is neither interactive nor background is a ValueError at once."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        self._send(m.SetPriority(request_id, priority))

    def embed(
        self, inputs: list[str | list[int]], *, truncate: bool = True, query: str | None = None,
        truncate_left: bool = False,
    ) -> Future:  # fmt: skip
        """Embed texts or token arrays, or rank documents against a `query`, in the runner
        (Engine.embed there); the Future's result
        is an Embedding, or the exception Engine.embed raised, or EngineStopped if the runner
        dies first. The runner reads as busy until it answers."""
        request_id = uuid.uuid4().hex
        future: Future = Future()
        with self._lock:
            if not self.alive:
                raise EngineStopped(self._stopped_message())
            self._embeds[request_id] = future
        self._send(m.Embed(request_id, list(inputs), truncate, query, truncate_left))
        return future

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 with_pieces: bool = False, images: tuple[Image, ...] = ()) -> Future:  # fmt: skip
        """The token ids of `text` (with its `images`) in the runner (Engine.tokenize there);
        the Future's result is a Tokens, or the exception Engine.tokenize raised, or
        EngineStopped if the runner dies first."""
        return self._ask_tokens(lambda rid: m.Tokenize(rid, text, add_special, with_pieces,
                                                       parse_special, tuple(images)))  # fmt: skip

    def detokenize(self, ids: list[int]) -> Future:
        """The text of token ids in the runner (Engine.detokenize there); a Future of a str."""
        return self._ask_tokens(lambda rid: m.Detokenize(rid, tuple(ids)))

    def forget_prompts(self, partition: str | None = None, *, everything: bool = False) -> Future:
        """Engine.forget_prompts in the runner; the Future's result is the entries dropped, or
        EngineStopped if the runner stops first."""
        request_id = uuid.uuid4().hex
        future: Future = Future()
        with self._lock:
            if not self.alive:
                raise EngineStopped(self._stopped_message())
            self._forgets[request_id] = future
        self._send(m.ForgetPrompts(request_id, partition, everything))
        return future

    def _ask_tokens(self, message: Callable[[str], object]) -> Future:
        request_id = uuid.uuid4().hex
        future: Future = Future()
        with self._lock:
            if not self.alive:
                raise EngineStopped(self._stopped_message())
            self._token_asks[request_id] = future
        self._send(message(request_id))
        return future

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._pending.pop(request_id, None)
            self._handles.pop(request_id, None)
            self._phases.pop(request_id, None)
            self._early.pop(request_id, None)

    # --- readings ----------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._ready.is_set() and self.exit is None and not self._stopping

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._handles or self._embeds)

    def info(self) -> dict:
        return dict(self._info)

    def snapshot(self) -> dict:
        """The runner's engine snapshot, asked for now (a few hundred microseconds); the last
        one it gave when it does not answer within SNAPSHOT_TIMEOUT_S (busy starting, or gone)."""
        if self.alive:
            with self._lock:
                self._snapshot_serial += 1
                serial = self._snapshot_serial
                answered = self._snapshot_waits[serial] = threading.Event()
            self._send(m.SnapshotRequest(serial))
            answered.wait(SNAPSHOT_TIMEOUT_S)
            with self._lock:
                self._snapshot_waits.pop(serial, None)
        return dict(self._snapshot) or {"name": self.name, "model": self.info()}

    # --- the reader thread -------------------------------------------------------------------

    def _send(self, message: object) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                pass  # the runner is gone: the reader reports it

    def _read(self) -> None:
        conn = self._conn
        try:
            while True:
                message = conn.recv()
                if isinstance(message, Event):
                    self._on_event(message)
                elif isinstance(message, m.Snapshot):
                    self._snapshot = message.snapshot
                    with self._lock:
                        answered = self._snapshot_waits.get(message.serial)
                    if answered is not None:
                        answered.set()
                elif isinstance(message, m.Embedded | m.EmbedFailed):
                    self._on_embedded(message)
                elif isinstance(message, m.Tokenized | m.Detokenized | m.TokensFailed):
                    self._on_tokens(message)
                elif isinstance(message, m.Accepted | m.SubmitRefused):
                    self._on_answer(message)
                elif isinstance(message, m.Ready):
                    self._info, self.load_seconds = message.info, message.load_seconds
                    self._ready.set()
                elif isinstance(message, m.LoadFailed):
                    self._load_failure = message.message
                    self._ready.set()
                elif isinstance(message, m.PromptsForgotten):
                    with self._lock:
                        future = self._forgets.pop(message.request_id, None)
                    if future is not None and not future.done():
                        if message.entries < 0:
                            future.set_exception(EngineStopped(self._stopped_message()))
                        else:
                            future.set_result(message.entries)
                elif isinstance(message, m.Stopped):
                    with self._lock:
                        self._stopping = True
                    self._stopped.set()
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a garbled message: treat the runner as lost
            log.exception("runner for %s sent something unreadable", self.name)
            self._kill()
        self._on_connection_closed()

    def _on_event(self, event: Event) -> None:
        with self._lock:
            handle = self._handles.get(event.request_id)
            if event.request_id in self._pending:  # its Accepted has not arrived yet
                self._early.setdefault(event.request_id, []).append(event)
                return
            if isinstance(event, PhaseEvent):
                self._phases[event.request_id] = event.phase
            if is_final(event):
                self._handles.pop(event.request_id, None)
                self._phases.pop(event.request_id, None)
                self.last_active = time.perf_counter()
                if event.type == "done":
                    self.answered += 1
        if handle is not None:
            handle.deliver(event)

    def _on_answer(self, answer: m.Accepted | m.SubmitRefused) -> None:
        with self._lock:
            pending = self._pending.pop(answer.request_id, None)
            early = self._early.pop(answer.request_id, [])
            if isinstance(answer, m.SubmitRefused):
                self._handles.pop(answer.request_id, None)
        if pending is None:
            return
        if isinstance(answer, m.SubmitRefused):
            pending.refusal = answer.refusal
        for event in early:
            self._on_event(event)
        pending.done.set()

    def _on_embedded(self, answer: m.Embedded | m.EmbedFailed) -> None:
        with self._lock:
            future = self._embeds.pop(answer.request_id, None)
            self.last_active = time.perf_counter()
        if future is None or future.done():
            return
        if isinstance(answer, m.Embedded):
            self.answered += 1  # its kernels ran: the runner really works here
            future.set_result(answer.embedding)
        else:
            future.set_exception(answer.refusal.error())

    def _on_tokens(self, answer: m.Tokenized | m.Detokenized | m.TokensFailed) -> None:
        with self._lock:
            future = self._token_asks.pop(answer.request_id, None)
        if future is None or future.done():
            return
        if isinstance(answer, m.Tokenized):
            future.set_result(Tokens(tuple(answer.tokens), answer.pieces))
        elif isinstance(answer, m.Detokenized):
            future.set_result(answer.text)
        else:
            future.set_exception(answer.refusal.error())

    def _on_connection_closed(self) -> None:
        returncode = None
        if self._proc is not None:
            try:
                returncode = self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # the socket closed but the process hangs on
                self._kill()
                returncode = self._proc.wait(timeout=5)
        with self._lock:
            phase = self._phase()
            self.exit = RunnerExit(returncode, phase, self._stopping, time.time())
            handles = list(self._handles.items())
            pending = list(self._pending.values())
            embeds = list(self._embeds.values())
            self._embeds.clear()
            token_asks = list(self._token_asks.values()) + list(self._forgets.values())
            self._token_asks.clear()
            self._forgets.clear()
            self._handles.clear()
            self._pending.clear()
            self._early.clear()
        if not self.exit.requested:
            log.error("runner for %s (pid %s) %s", self.name, self.pid, self.exit.reason)
        for request_id, handle in handles:
            handle.deliver(self._death_event(request_id))
        for future in embeds:
            requested = self.exit.requested
            future.set_exception(EngineStopped(
                f"{self.name} was unloaded while embedding" if requested
                else self.exit.sentence(self.name)
            ))  # fmt: skip
        for future in token_asks:
            future.set_exception(EngineStopped(self._stopped_message()))
        for waiting in pending:
            waiting.refusal = Refusal(RefusalKind.UNAVAILABLE, self._stopped_message())
            waiting.done.set()
        self._ready.set()  # a start() still waiting learns of the death
        self._stopped.set()  # and a shutdown() waiting for Stopped
        with self._lock:
            waits = list(self._snapshot_waits.values())
        for answered in waits:
            answered.set()
        if self.on_exit is not None:
            try:
                self.on_exit(self, self.exit)
            except Exception:  # noqa: BLE001
                log.exception("the exit callback for %s failed", self.name)

    def _phase(self) -> str:
        """What the runner was doing (under _lock): the furthest phase of any request."""
        if self._stopping:
            return "shutdown"
        if not self._ready.is_set():
            return "load"
        phases = set(self._phases.values())
        for phase, label in (("decoding", "decode"), ("prefilling", "prefill")):
            if phase in phases:
                return label
        return "queue" if phases else "idle"

    def _stopped_message(self) -> str:
        if self.exit is not None and not self.exit.requested:
            return self.exit.sentence(self.name)
        return f"the runner for {self.name} is not running"

    def _death_event(self, request_id: str) -> ErrorEvent:
        if self.exit is not None and self.exit.requested:
            message = f"{self.name} was unloaded while answering"
        else:
            what = self.exit.sentence(self.name) if self.exit else self._stopped_message()
            message = f"{what}; the answer so far is kept"
        return ErrorEvent(request_id, message, {}, code=RefusalKind.UNAVAILABLE)
