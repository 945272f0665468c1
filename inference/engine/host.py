"""Loaded models: load, unload, keep-alive and least-recently-used eviction.

The host owns one engine per loaded model: an in-process Engine on a runner from
`runner_factory`, or whatever `engine_factory` starts (the appliance's runner processes,
inference.serving.supervisor), which offers the same interface (ServingEngine). An engine that
stopped by itself (its runner process died) is dropped, and the next request loads anew.

Loading is charged to the request that needed it (its `load_time`), and keep-alive follows
Ollama: a duration after the last answer, 0 unloads right after the answer, a negative value
keeps the model loaded.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inference.engine.engine import Engine
from inference.engine.events import RequestHandle
from inference.engine.params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """What the host needs to load a model; built from the registry's record."""

    name: str
    config: object  # a RunnerConfig (kept untyped so this module never imports llama_cpp)
    keep_alive: float = 300.0  # seconds after the last answer; < 0: forever


class ServingEngine(Protocol):
    """What the host needs of a loaded model's engine (Engine, or a runner process)."""

    last_active: float

    def submit(self, prompt, params=None, **kwargs) -> RequestHandle: ...
    def info(self) -> dict: ...
    def snapshot(self) -> dict: ...
    def shutdown(self, timeout: float = 10.0) -> None: ...
    @property
    def busy(self) -> bool: ...
    @property
    def alive(self) -> bool: ...


@dataclass(slots=True)
class Loaded:
    spec: ModelSpec
    engine: ServingEngine
    loaded_at: float
    load_seconds: float
    keep_alive: float
    last_used: float = field(default_factory=time.monotonic)

    def expires_in(self, now: float) -> float | None:
        if self.keep_alive < 0:
            return None
        if self.engine.busy:
            return self.keep_alive
        return self.keep_alive - (now - max(self.last_used, self.engine.last_active))


class ModelBusy(RuntimeError):
    """A model cannot be unloaded or evicted while it is answering."""


class EngineHost:
    def __init__(
        self,
        runner_factory: Callable[[object], object] | None = None,
        *,
        engine_factory: Callable[[ModelSpec], ServingEngine] | None = None,
        max_loaded: int = 1,
        itl_target: float = 0.1,
        max_queue: int = 64,
        validate: Callable[[ModelSpec], None] | None = None,
        preflight: Callable[[ModelSpec], None] | None = None,
    ):
        self._runner_factory = runner_factory or _llama_runner
        self._engine_factory = engine_factory or self._in_process_engine
        self.max_loaded = max_loaded
        self.itl_target = itl_target
        self.max_queue = max_queue
        self.validate = validate  # before anything is evicted: is the file sound?
        self.preflight = preflight  # after room is made: does it fit?
        self._loaded: dict[str, Loaded] = {}
        self._lock = threading.RLock()  # held during loads: one load at a time
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        self.loading: str | None = None  # shown on the dashboard while a load is under way

    # --- lifecycle ---------------------------------------------------------------------------

    def load(self, spec: ModelSpec) -> tuple[ServingEngine, float]:
        """The model's engine, loading it if needed; returns (engine, seconds this call waited)."""
        started = time.perf_counter()
        with self._lock:
            self._drop_stopped()
            current = self._loaded.get(spec.name)
            if current is not None:
                # Like Ollama, each request's keep-alive (the model's default when it names
                # none) replaces the last one.
                current.keep_alive = spec.keep_alive
                current.last_used = time.perf_counter()
                return current.engine, time.perf_counter() - started
            if self.validate is not None:
                self.validate(spec)
            self._make_room()
            if self.preflight is not None:
                self.preflight(spec)
            self.loading = spec.name
            try:
                load_started = time.perf_counter()
                engine = self._engine_factory(spec)
            finally:
                self.loading = None
            now = time.perf_counter()
            self._loaded[spec.name] = Loaded(
                spec, engine, loaded_at=time.time(), load_seconds=now - load_started,
                keep_alive=spec.keep_alive, last_used=now,
            )  # fmt: skip
            log.info("loaded %s in %.2f s", spec.name, now - load_started)
            return engine, now - started

    def _in_process_engine(self, spec: ModelSpec) -> Engine:
        runner = self._runner_factory(spec.config)
        return Engine(
            runner, itl_target=self.itl_target, max_queue=self.max_queue, name=spec.name
        ).start()

    def _drop_stopped(self) -> None:
        """(Under _lock.) Forget engines that stopped by themselves (a runner process died)."""
        for name, loaded in list(self._loaded.items()):
            if not loaded.engine.alive:
                del self._loaded[name]
                log.warning("%s had stopped; it loads again on its next request", name)

    def _make_room(self) -> None:
        while len(self._loaded) >= self.max_loaded:
            idle = [m for m in self._loaded.values() if not m.engine.busy]
            if not idle:
                raise ModelBusy(
                    f"{len(self._loaded)} model(s) loaded (the maximum) and all are answering"
                )
            victim = min(idle, key=lambda m: m.last_used)
            self._unload_locked(victim.spec.name)

    def unload(self, name: str, *, force: bool = False) -> bool:
        with self._lock:
            loaded = self._loaded.get(name)
            if loaded is None:
                return False
            if not force and loaded.engine.busy:
                raise ModelBusy(f"{name} is answering a request")
            self._unload_locked(name)
            return True

    def _unload_locked(self, name: str) -> None:
        loaded = self._loaded.pop(name)
        loaded.engine.shutdown()
        log.info("unloaded %s", name)

    def unload_idle(self) -> list[str]:
        """Unload every model whose keep-alive has run out; returns their names."""
        now = time.perf_counter()
        expired = []
        with self._lock:
            self._drop_stopped()
            for name, loaded in list(self._loaded.items()):
                remaining = loaded.expires_in(now)
                # Busy never expires: with keep_alive 0, expires_in is 0 even mid-answer.
                if remaining is not None and remaining <= 0 and not loaded.engine.busy:
                    self._unload_locked(name)
                    expired.append(name)
        return expired

    def start_sweeper(self, interval: float = 0.5) -> None:
        def sweep() -> None:
            while not self._stop.wait(interval):
                try:
                    self.unload_idle()
                except Exception:  # noqa: BLE001 - keep sweeping
                    log.exception("idle unload failed")

        self._sweeper = threading.Thread(target=sweep, name="keep-alive", daemon=True)
        self._sweeper.start()

    def shutdown(self) -> None:
        self._stop.set()
        with self._lock:
            for name in list(self._loaded):
                self._unload_locked(name)

    # --- requests ----------------------------------------------------------------------------

    def submit(
        self,
        spec: ModelSpec,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        keep_alive: float | None = None,
        accepted_at: float | None = None,
        **kwargs,
    ) -> RequestHandle:
        """Load the model if needed (charging the wait to this request) and submit."""
        accepted = time.perf_counter() if accepted_at is None else accepted_at
        with self._lock:  # so the keep-alive sweep cannot unload between load and submit
            engine, waited = self.load(spec)
            loaded = self._loaded[spec.name]
            if keep_alive is not None:
                loaded.keep_alive = keep_alive
            return engine.submit(
                prompt, params, accepted_at=accepted, load_time=waited if waited > 0.05 else 0.0,
                **kwargs,
            )  # fmt: skip

    def touch(self, name: str) -> None:
        """Restart a model's keep-alive clock (called when an answer ends)."""
        loaded = self._loaded.get(name)
        if loaded is not None:
            loaded.last_used = time.perf_counter()

    # --- readings ----------------------------------------------------------------------------

    def get(self, name: str) -> ServingEngine | None:
        loaded = self._loaded.get(name)
        return loaded.engine if loaded else None

    def loaded(self) -> list[dict]:
        """What is loaded, like `ollama ps`."""
        now = time.perf_counter()
        rows = []
        for name, loaded in list(self._loaded.items()):
            if not loaded.engine.alive:
                continue
            info = loaded.engine.info()
            expires = loaded.expires_in(now)
            rows.append({
                "name": name,
                "loaded_at": loaded.loaded_at,
                "load_seconds": loaded.load_seconds,
                "size_bytes": info.get("size_bytes", 0),
                "busy": loaded.engine.busy,
                "keep_alive": loaded.keep_alive,
                "expires_in": expires,
                "n_ctx": info.get("n_ctx"),
            })  # fmt: skip
        return rows

    def snapshots(self) -> dict[str, dict]:
        return {
            name: m.engine.snapshot() for name, m in list(self._loaded.items()) if m.engine.alive
        }


def _llama_runner(config: object) -> object:
    from inference.engine.runner import LlamaRunner  # the only path that imports llama_cpp

    return LlamaRunner(config)
