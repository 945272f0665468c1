"""Starting, watching and restarting runner processes: one per loaded model.

`RunnerSupervisor.start(spec)` is the engine factory of the serving host (EngineHost): each
loaded model is a RunnerProcess. What the supervisor adds:

1. The CPU self-check (inference.serving.cpu_check): a runner killed by a signal while it
   loads is started once more without llama.cpp's extra buffer types, and the verdict is kept
   for the host; a runner killed by a signal before its first answer sets the verdict too, so
   its restart is safe.
2. Crash records per model: state, restarts, the last exit ("killed by signal 11 (SIGSEGV)
   during decode"), shown on the dashboard, /healthz and the model page.
3. Back-off: the first crash restarts on the next request; each further crash in a row (no
   answer finished in between) doubles a wait, up to MAX_BACKOFF_S, during which a request for
   that model is refused with a message saying so, instead of crash-looping.
4. A spare runner (`spare_runner`): after each load, one runner interpreter is started with the
   imports a load needs done (llama_cpp, numpy, the engine), waiting for its Launch, so the next
   load (a model unloaded by keep-alive and asked for again, another model) starts in it and
   skips ~0.35 s of interpreter start and imports on a 2-core CPU. It costs one idle process
   (~70 MB) and is started after a load, never during one.
"""

import dataclasses
import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Literal, TypedDict

from inference.engine.host import ModelSpec
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.tiers.config import PromptCacheConfig
from inference.serving.cpu_check import CpuCheck
from inference.serving.runner_process import (
    DEFAULT_RUNNER_FACTORY,
    RunnerExit,
    RunnerLoadError,
    RunnerProcess,
    Spawned,
    spawn,
)

log = logging.getLogger(__name__)

# The signals of a native fault (what AMX under a hypervisor gives); SIGKILL (OOM killer, a
# person) says nothing about the CPU.
FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL, signal.SIGBUS})
FIRST_BACKOFF_S = 2.0
MAX_BACKOFF_S = 60.0

RunnerStateName = Literal["starting", "running", "stopped", "crashed", "backing off", "failed"]


class RunnerBackoff(Refused, RuntimeError):
    """The model's runner crashed repeatedly; it is not restarted until the wait is over."""

    kind = RefusalKind.UNAVAILABLE


class RunnerState(TypedDict):
    """One model's runner as the pages and /healthz show it."""

    model: str
    state: RunnerStateName
    pid: int | None
    restarts: int
    crashes_in_a_row: int
    last_exit: str | None
    last_exit_at: float | None
    retry_in: float | None  # seconds until a restart is allowed (backing off)
    extra_bufts: bool  # llama.cpp's extra buffer types on for this runner
    note: str  # the CPU self-check's finding, if it changed anything


@dataclass(slots=True)
class _Record:
    model: str
    state: RunnerStateName = "starting"
    pid: int | None = None
    restarts: int = 0
    crashes_in_a_row: int = 0
    last_exit: str | None = None
    last_exit_at: float | None = None
    retry_at: float = 0.0  # time.monotonic()
    extra_bufts: bool = True
    note: str = ""
    process: RunnerProcess | None = None


class RunnerSupervisor:
    def __init__(
        self,
        *,
        itl_target: float = 0.1,
        background_itl_target: float = 1.0,
        max_queue: int = 64,
        state_dir=None,
        runner_factory: str = DEFAULT_RUNNER_FACTORY,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        prompt_cache: PromptCacheConfig | None = None,
        spare_runner: bool = False,
        speculative: str = "auto",
    ):
        """`prompt_cache`: the warm memory every runner gets (its model's digest filled in per
        launch); None: runners keep prompts in their slots only. `spare_runner`: keep a runner
        interpreter started after each load (4. above)."""
        self.prompt_cache = prompt_cache
        self.speculative = speculative  # SPECULATIVE_DECODING, for every runner
        self.spare_runner = spare_runner and runner_factory == DEFAULT_RUNNER_FACTORY
        self._spare: Spawned | None = None
        self._closed = False
        self.itl_target = itl_target
        self.background_itl_target = background_itl_target
        self.max_queue = max_queue
        self.runner_factory = runner_factory
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.cpu = CpuCheck(state_dir)
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    # --- the engine factory ------------------------------------------------------------------

    def start(self, spec: ModelSpec) -> RunnerProcess:
        """A running runner for the model; raises RunnerBackoff or RunnerLoadError."""
        record = self._begin(spec.name)
        config = spec.config
        if config.use_extra_bufts and not self.cpu.extra_bufts_allowed():
            config = dataclasses.replace(config, use_extra_bufts=False)
        try:
            process = self._launch(spec, config)
        except RunnerLoadError as exc:
            if not (_faulted(exc.exit) and config.use_extra_bufts):
                self._failed(record, exc)
                raise
            # 1. The CPU self-check: once more without the extra buffer types.
            verdict = self.cpu.record_unsafe(spec.name, exc.exit.reason)
            with self._lock:
                self._count_crash(record, exc.exit, answered=False)
                record.note = _self_check_note(verdict.reason)
                record.restarts += 1
            config = dataclasses.replace(config, use_extra_bufts=False)
            try:
                process = self._launch(spec, config)
            except RunnerLoadError as again:
                self._failed(record, again)
                raise
        with self._lock:
            record.state, record.pid, record.process = "running", process.pid, process
            record.extra_bufts = config.use_extra_bufts
        process.on_exit = self._exited
        if process.exit is not None:  # it died before the callback was in place
            self._exited(process, process.exit)
        return process

    def _launch(self, spec: ModelSpec, config) -> RunnerProcess:
        prompt_cache = self.prompt_cache
        if prompt_cache is not None:
            prompt_cache = dataclasses.replace(prompt_cache, model_sha256=spec.sha256)
        with self._lock:
            spare, self._spare = self._spare, None
        try:
            return RunnerProcess(
                spec.name, config, itl_target=self.itl_target,
                background_itl_target=self.background_itl_target, max_queue=self.max_queue,
                runner_factory=self.runner_factory, prompt_cache=prompt_cache,
                speculative=self.speculative,
            ).start(spare)  # fmt: skip
        finally:
            self._spare_later()

    def _spare_later(self) -> None:
        """Start the next spare runner in the background (4.), after the load that used one."""
        if not self.spare_runner:
            return

        def make() -> None:
            module = DEFAULT_RUNNER_FACTORY.partition(":")[0]
            spare = spawn(preload=module)
            with self._lock:
                keep = not self._closed and self._spare is None
                if keep:
                    self._spare = spare
            if not keep:
                spare.discard()

        threading.Thread(target=make, name="spare-runner", daemon=True).start()

    def close(self) -> None:
        """Let go of the spare runner (the runners themselves belong to the host)."""
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()

    def _begin(self, name: str) -> _Record:
        with self._lock:
            record = self._records.setdefault(name, _Record(name))
            wait = record.retry_at - time.monotonic()
            if wait > 0:
                raise RunnerBackoff(
                    f"the runner for {name} crashed {record.crashes_in_a_row} times in a row "
                    f"(last: {record.last_exit}); it is not restarted for another {wait:.0f} s"
                )
            if record.last_exit is not None and record.state in ("crashed", "backing off"):
                record.restarts += 1
            record.state, record.pid = "starting", None
            return record

    def _failed(self, record: _Record, exc: RunnerLoadError) -> None:
        with self._lock:
            record.state, record.process, record.pid = "failed", None, None
            if exc.exit is not None:  # it died: counts as a crash and backs off
                self._count_crash(record, exc.exit, answered=False)
            else:
                record.last_exit, record.last_exit_at = f"load failed: {exc}", time.time()

    # --- exits -------------------------------------------------------------------------------

    def _exited(self, process: RunnerProcess, exit: RunnerExit) -> None:
        with self._lock:
            record = self._records.get(process.name)
            if record is None or record.process is not process:
                return
            record.process, record.pid = None, None
            if exit.requested:
                record.state = "stopped"
                return
            self._count_crash(record, exit, answered=process.answered > 0)
        if _faulted(exit) and process.answered == 0 and process.config.use_extra_bufts:
            # Killed before its first answer with the extra buffer types on: the restart
            # runs without them.
            verdict = self.cpu.record_unsafe(process.name, exit.reason)
            with self._lock:
                record.note = _self_check_note(verdict.reason)

    def _count_crash(self, record: _Record, exit: RunnerExit, *, answered: bool) -> None:
        """(Under _lock.) One more crash; a streak that answered nothing backs off."""
        record.crashes_in_a_row = 1 if answered else record.crashes_in_a_row + 1
        record.last_exit, record.last_exit_at = exit.reason, exit.at
        if record.crashes_in_a_row >= 2:
            wait = min(self.max_backoff_s,
                       self.first_backoff_s * 2 ** (record.crashes_in_a_row - 2))  # fmt: skip
            record.retry_at = time.monotonic() + wait
            record.state = "backing off"
            log.error("the runner for %s crashed %d times in a row; next start in %.0f s",
                      record.model, record.crashes_in_a_row, wait)  # fmt: skip
        else:
            record.state = "crashed"

    # --- readings ----------------------------------------------------------------------------

    def states(self) -> list[RunnerState]:
        now = time.monotonic()
        with self._lock:
            rows = []
            for record in self._records.values():
                retry_in = record.retry_at - now
                state = record.state
                if state == "backing off" and retry_in <= 0:
                    state = "crashed"
                rows.append(RunnerState(
                    model=record.model, state=state, pid=record.pid, restarts=record.restarts,
                    crashes_in_a_row=record.crashes_in_a_row, last_exit=record.last_exit,
                    last_exit_at=record.last_exit_at,
                    retry_in=retry_in if retry_in > 0 else None,
                    extra_bufts=record.extra_bufts, note=record.note,
                ))  # fmt: skip
            return rows

    def pids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(r.pid for r in self._records.values() if r.pid is not None)


def _faulted(exit: RunnerExit | None) -> bool:
    return exit is not None and exit.signal in FAULT_SIGNALS


def _self_check_note(reason: str) -> str:
    return (
        f"CPU self-check: the runner {reason} with llama.cpp's extra buffer types (AMX, "
        "repacking), so models on this host load without them"
    )
