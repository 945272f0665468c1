"""Loaded models: load, unload, keep-alive and least-recently-used eviction.

The host owns one engine per loaded model, whatever its `engine_factory` starts: the
appliance's runner processes (inference.serving.supervisor), or in tests an Engine on a fake
runner; both offer the same interface (ServingEngine). It has no default: a model's engine never
runs in the host's own process. An engine that stopped by itself (its runner process died) is
dropped, and the next request loads anew.

Loading is charged to the request that needed it (its `load_time`), and keep-alive follows
Ollama: a duration after the last answer, 0 unloads right after the answer, a negative value
keeps the model loaded.

Context per sequence: a spec may leave it automatic (ctx_per_seq 0); the preflight sizes it
before the load (inference.planning.preflight.fit). A request that needs more than the loaded engine
holds (Ollama's num_ctx: `ModelSpec.min_ctx`, or a larger setting saved since the load)
reloads the model with that context, as Ollama does: once the answers running on it have ended
(waiting at most RELOAD_WAIT_S, then ModelBusy), and only after the preflight said the larger
context fits in place of the loaded one, so a refused reload leaves the loaded model as it was.
Needing less never reloads.
"""

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from inference.engine.events import RequestHandle
from inference.engine.generation import GenerationRequest
from inference.engine.media import Image
from inference.engine.refusals import RefusalKind, Refused

log = logging.getLogger(__name__)

# The context per sequence of an automatic spec when no preflight sized it (tests' hosts).
FALLBACK_CTX = 2048
# How long a reload for a larger context waits for the loaded engine's answers to end.
RELOAD_WAIT_S = 120.0


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """What the host needs to load a model (inference.catalog.specs.spec_for builds it)."""

    name: str
    config: object  # a RunnerConfig (kept untyped so this module never imports llama_cpp)
    keep_alive: float = 300.0  # seconds after the last answer; < 0: forever
    # The context per sequence this request needs (Ollama's num_ctx; 0: whatever is loaded).
    # A loaded engine with less is reloaded with it; a load without one gets max(config's, this).
    min_ctx: int = 0
    # The file's content digest (the catalog's): an inference worker on another box finds its
    # own copy by it (inference.serving.model_index) and uses config.model_path only while the
    # digest is unknown. "": not hashed yet.
    sha256: str = ""
    # The draft model's digest (config.draft_model_path's file), found the same way; "": none,
    # or not hashed yet.
    draft_sha256: str = ""
    # The vision projector's digest (config.mmproj_path's file), found the same way; "": none.
    mmproj_sha256: str = ""
    # What the host's preflight chose when it fitted the config to the machine, and why
    # (inference.planning.fitting); "" before (a spec crosses the wire unfitted).
    fitted: str = ""

    @property
    def needed_ctx(self) -> int:
        return max(_ctx_of(self.config), self.min_ctx)

    def to_wire(self) -> dict:
        """As JSON (split mode): an inference worker on another box needs no database."""
        return {"name": self.name, "keep_alive": self.keep_alive,
                "config": dataclasses.asdict(self.config), "min_ctx": self.min_ctx,
                "sha256": self.sha256, "draft_sha256": self.draft_sha256,
                "mmproj_sha256": self.mmproj_sha256}  # fmt: skip

    @classmethod
    def from_wire(cls, data: dict) -> "ModelSpec":
        from inference.engine.runner_config import RunnerConfig  # plain data, no llama_cpp

        digests = {key: data.get(key) or "" for key in ("sha256", "draft_sha256", "mmproj_sha256")}
        for key, digest in digests.items():
            if not isinstance(digest, str) or len(digest) not in (0, 64):
                raise ValueError(f"{key} must be a hex digest")
        return cls(data["name"], RunnerConfig(**data["config"]), data["keep_alive"],
                   min_ctx=int(data.get("min_ctx") or 0), sha256=digests["sha256"].lower(),
                   draft_sha256=digests["draft_sha256"].lower(),
                   mmproj_sha256=digests["mmproj_sha256"].lower())  # fmt: skip


class ServingEngine(Protocol):
    """What the host needs of a loaded model's engine (Engine, or a runner process)."""

    last_active: float

    def submit(self, request: GenerationRequest, *, load_time: float = 0.0) -> RequestHandle: ...
    def embed(
        self, inputs: list, *, truncate: bool = True, query: str | None = None,
        truncate_left: bool = False,
    ) -> Future: ...  # of an Embedding (scores with a query: inference.engine.reranking)
    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True,
        with_pieces: bool = False, images: tuple[Image, ...] = (),
    ) -> Future: ...  # of a Tokens (inference.engine.tokens)
    def detokenize(self, ids: list[int]) -> Future: ...  # of a str
    # Drop a partition's kept prompts (everything: all of them); a Future of the entries dropped.
    def forget_prompts(
        self, partition: str | None = None, *, everything: bool = False
    ) -> Future: ...
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

    @property
    def ctx_per_seq(self) -> int:
        return _ctx_of(self.spec.config)  # concrete: the spec as sized at load

    def expires_in(self, now: float) -> float | None:
        if self.keep_alive < 0:
            return None
        if self.engine.busy:
            return self.keep_alive
        return self.keep_alive - (now - max(self.last_used, self.engine.last_active))


class ModelBusy(Refused, RuntimeError):
    """A model cannot be unloaded or evicted while it is answering."""

    kind = RefusalKind.BUSY


class EngineHost:
    def __init__(
        self,
        engine_factory: Callable[[ModelSpec], ServingEngine],
        *,
        max_loaded: int = 1,
        validate: Callable[[ModelSpec], None] | None = None,
        preflight: Callable[..., ModelSpec | None] | None = None,
    ):
        self._engine_factory = engine_factory
        self.max_loaded = max_loaded
        self.validate = validate  # before anything is evicted: is the file sound?
        # After room is made: does it fit? Called as preflight(spec), or preflight(spec,
        # replacing=<the loaded spec>) for a reload; raises to refuse, returns the spec to load
        # (its context sized) or None to load it as given.
        self.preflight = preflight
        self._loaded: dict[str, Loaded] = {}
        # Told what is loaded after each load and each unload asked for (not at shutdown):
        # inference.serving.warm_start records it, so a restart loads the same models again.
        self.on_change: Callable[[list[ModelSpec]], None] | None = None
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
            if current is not None and spec.needed_ctx > current.ctx_per_seq:
                self._reload_larger(current, spec)
                return self._loaded[spec.name].engine, time.perf_counter() - started
            if current is not None:
                # Like Ollama, each request's keep-alive (the model's default when it names
                # none) replaces the last one.
                current.keep_alive = spec.keep_alive
                current.last_used = time.perf_counter()
                return current.engine, time.perf_counter() - started
            if self.validate is not None:
                self.validate(spec)
            self._make_room()
            self._start(self._sized(spec))
            return self._loaded[spec.name].engine, time.perf_counter() - started

    def _reload_larger(self, current: Loaded, spec: ModelSpec) -> None:
        """(Under _lock.) The model again with the larger context `spec` needs, in place of the
        loaded engine: once its answers ended, and only if the larger one fits."""
        if self.validate is not None:
            self.validate(spec)
        deadline = time.monotonic() + RELOAD_WAIT_S
        while current.engine.busy and current.engine.alive:
            if time.monotonic() >= deadline:
                raise ModelBusy(
                    f"{spec.name} holds {current.ctx_per_seq} tokens per sequence and a context "
                    f"of {spec.needed_ctx} needs a reload, but it is still answering; try again"
                )
            time.sleep(0.05)
        sized = self._sized(spec, replacing=current.spec)  # refuses with the loaded one intact
        log.info("reloading %s: %d tokens per sequence asked, %d loaded",
                 spec.name, spec.needed_ctx, current.ctx_per_seq)  # fmt: skip
        self._unload_locked(spec.name)
        self._start(sized)

    def _sized(self, spec: ModelSpec, replacing: ModelSpec | None = None) -> ModelSpec:
        """The spec to load: as the preflight sized it (and refused it if it cannot fit), its
        context per sequence concrete and at least what the request needs."""
        if self.preflight is not None:
            extra = {"replacing": replacing} if replacing is not None else {}
            spec = self.preflight(spec, **extra) or spec
        config = spec.config
        if not hasattr(config, "ctx_per_seq"):
            return spec  # a test's stand-in config: nothing to size
        ctx = max(config.ctx_per_seq or FALLBACK_CTX, spec.min_ctx)
        if ctx != config.ctx_per_seq:
            spec = dataclasses.replace(spec, config=dataclasses.replace(config, ctx_per_seq=ctx))
        return spec

    def _start(self, spec: ModelSpec) -> None:
        """(Under _lock.) Start the engine of a sized spec and record it as loaded."""
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
        log.info("loaded %s in %.2f s (%d tokens per sequence)",
                 spec.name, now - load_started, _ctx_of(spec.config))  # fmt: skip
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change([loaded.spec for loaded in self._loaded.values()])
            except Exception:  # noqa: BLE001 - a record is not worth a failed load
                log.exception("recording the loaded models")

    def _drop_stopped(self) -> None:
        """(Under _lock.) Forget engines that stopped by themselves (a runner process died)."""
        for name, loaded in list(self._loaded.items()):
            if not loaded.engine.alive:
                del self._loaded[name]
                log.warning("%s had stopped; it loads again on its next request", name)
                self._changed()

    def _make_room(self) -> None:
        while len(self._loaded) >= self.max_loaded:
            idle = [m for m in self._loaded.values() if not m.engine.busy]
            if not idle:
                raise ModelBusy(
                    f"{len(self._loaded)} model(s) loaded (the maximum) and all are answering"
                )
            victim = min(idle, key=lambda m: m.last_used)
            self._unload_locked(victim.spec.name)
            self._changed()

    def unload(self, name: str, *, force: bool = False) -> bool:
        with self._lock:
            loaded = self._loaded.get(name)
            if loaded is None:
                return False
            if not force and loaded.engine.busy:
                raise ModelBusy(f"{name} is answering a request")
            self._unload_locked(name)
            self._changed()
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
            if expired:
                self._changed()
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

    def submit(self, spec: ModelSpec, request: GenerationRequest) -> RequestHandle:
        """Load the model if needed (charging the wait to this request) and submit."""
        with self._lock:  # so the keep-alive sweep cannot unload between load and submit
            engine, waited = self.load(spec)
            if request.keep_alive is not None:
                self._loaded[spec.name].keep_alive = request.keep_alive
            return engine.submit(request, load_time=waited if waited > 0.05 else 0.0)

    def embed(
        self, spec: ModelSpec, inputs: list, *, truncate: bool = True,
        keep_alive: float | None = None, query: str | None = None, truncate_left: bool = False,
    ) -> tuple[Future, float]:  # fmt: skip
        """Load the model if needed and start embedding `inputs` (inference.engine.embedding),
        or ranking them against `query` (inference.engine.reranking); (the Future of its
        Embedding, seconds this call waited for the load)."""
        with self._lock:  # the engine reads as busy from embed() on: the sweep leaves it
            engine, waited = self.load(spec)
            if keep_alive is not None:
                self._loaded[spec.name].keep_alive = keep_alive
            return engine.embed(inputs, truncate=truncate, query=query,
                                truncate_left=truncate_left), waited

    def tokenize(
        self, spec: ModelSpec, text: str, *, add_special: bool = True, parse_special: bool = True,
        with_pieces: bool = False, images: tuple[Image, ...] = (),
    ) -> tuple[Future, float]:  # fmt: skip
        """Load the model if needed and start tokenizing `text` with its `images`
        (inference.engine.tokens); (the Future of its Tokens, seconds this call waited for the
        load)."""
        with self._lock:
            engine, waited = self.load(spec)
            future = engine.tokenize(text, add_special=add_special, parse_special=parse_special,
                                     with_pieces=with_pieces, images=images)  # fmt: skip
            return future, waited

    def detokenize(self, spec: ModelSpec, ids: list[int]) -> tuple[Future, float]:
        """Load the model if needed and start detokenizing `ids`; (the Future of the text,
        seconds this call waited for the load)."""
        with self._lock:
            engine, waited = self.load(spec)
            return engine.detokenize(ids), waited

    def forget_prompts(
        self, partition: str | None = None, *, everything: bool = False, name: str | None = None
    ) -> int:
        """Drop kept prompts in the loaded engines (only model `name`'s when given): a
        partition's, or with `everything` all of them; returns the tier entries dropped."""
        dropped = 0
        for model, loaded in list(self._loaded.items()):
            if name is not None and model != name or not loaded.engine.alive:
                continue
            try:
                dropped += loaded.engine.forget_prompts(partition, everything=everything).result(30)
            except Exception as exc:  # noqa: BLE001 - it stopped meanwhile: nothing is kept
                log.info("%s could not forget kept prompts: %s", model, exc)
        return dropped

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
                "ctx_per_seq": info.get("ctx_per_seq") or loaded.ctx_per_seq,
                "parallel": getattr(loaded.spec.config, "parallel", 1),
                "sha256": loaded.spec.sha256,
                "fitted": loaded.spec.fitted,
                "draft_model": info.get("draft_model"),
                # Its vision projector (runner.info): None for a text-only model.
                "vision": info.get("vision"),
            })  # fmt: skip
        return rows

    def snapshots(self) -> dict[str, dict]:
        return {
            name: m.engine.snapshot() for name, m in list(self._loaded.items()) if m.engine.alive
        }


def _ctx_of(config: object) -> int:
    """A config's context per sequence (0: automatic, or a stand-in config without one)."""
    return getattr(config, "ctx_per_seq", 0) or 0
