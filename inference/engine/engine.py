"""The engine loop: one thread owns the runner; `step() = schedule → run → update`.

Submission and cancellation arrive as messages on an inbox; events leave through each request's
handle. A failure in one request fails that request, never the loop. Who goes first is the
scheduler's (scheduler.py: fair share across apps and people, interactive before background);
how long a step may take is the budget's (budget.py: the ITL target while a person reads a
stream, otherwise a step at the cost curve's knee within the loose background target).

Interface (what the web app, the worker and the LAN API build on):
    engine = Engine(runner, itl_target=0.1, background_itl_target=1.0).start()
    handle = engine.submit(GenerationRequest("prompt text" or (token ids), SamplingParams(...),
                                             cache_key="conv-1"))
    for event in handle.events(): ...        # or: async for event in handle.aevents()
    engine.cancel(handle.id)                 # thread-safe, at any point
    engine.set_priority(handle.id, "background")  # nobody reads it now; thread-safe too
    engine.forget_prompts("apikey:3")        # drop what a partition's prompts left (a Future)
    engine.snapshot()                        # telemetry, readable from any thread
    engine.shutdown()                        # what idle slots keep goes into the tiers
    engine.persist_prompts(timeout=10)       # and the RAM tier to disk (runner_main does this)

A request with images (GenerationRequest.media) is read first by the encoder thread, beside the
steps (inference.engine.vision: phase "encoding"), then queued like any other.

With a PromptStore (inference.engine.tiers), the engine keeps what its sequences have read
beyond their slots: the scheduler plans the saves and restores (scheduler.py), the engine
applies them in each step before the run, and reports where each request's cached tokens came
from (Request.cached_by_tier) and what restoring them took.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from inference.engine.budget import TokenBudget
from inference.engine.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    PausedEvent,
    PhaseEvent,
    PrefillEvent,
    QueueEvent,
    RequestHandle,
    StepLogprobs,
    TokenEvent,
)
from inference.engine.generation import PRIORITIES, GenerationRequest, Priority
from inference.engine.media import Image
from inference.engine.params import InvalidParams, SamplingParams
from inference.engine.prefix_cache import KvRestore, KvSave, KvTrim
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.request import Request, Status
from inference.engine.scheduler import Chunk, QueueFull, Scheduler, StepPlan
from inference.engine.speculation.policy import Speculation
from inference.engine.telemetry import Telemetry
from inference.engine.textstream import TextStream
from inference.engine.tiers import PromptStore, RestoreCosts
from inference.engine.tiers.disk import DiskResult
from inference.engine.tiers.entries import conversation_digest
from inference.engine.vision import (
    Encoder,
    EncoderStopped,
    MediaJob,
    MediaPrompt,
    check_pictures,
    is_media,
)

log = logging.getLogger(__name__)

STREAM_RATE_S = 3.0  # a stream's live tok/s on the dashboard: over its last tokens this recent
MAX_SHARE_ROWS = 32  # rows of the snapshot's "shares" table
MAX_WARM_ROWS = 256  # conversations a snapshot names as kept (the router's hint, bounded)
# A stopping engine's save may wait this long for RAM that writes to disk are freeing.
KEEP_WAIT_S = 1.0

__all__ = ["Engine", "PromptTooLong", "QueueFull", "Runner", "EngineStopped"]


class PromptTooLong(Refused, ValueError):
    """The prompt does not fit the context: it can never run, so it is refused at submit."""

    kind = RefusalKind.TOO_LONG


class EngineStopped(Refused, RuntimeError):
    """The engine is shutting down or has stopped."""

    kind = RefusalKind.UNAVAILABLE


class Runner(Protocol):
    """What the engine needs from a model runner (see runner.py for the llama.cpp one)."""

    n_ctx: int  # KV cells in the context, shared by all sequences
    n_slots: int  # sequence ids
    ctx_per_seq: int  # the most tokens one sequence may hold
    n_batch: int  # the most tokens one execute() call may carry

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...
    def piece(self, token: int) -> bytes: ...
    def special_piece(self, token: int) -> bytes: ...  # special tokens written out
    def is_eog(self, token: int) -> bool: ...
    def validate(self, params: SamplingParams) -> None: ...  # InvalidParams: e.g. a bad grammar
    def prepare(self, request: Request) -> None: ...  # set up the request's sampler
    def release(self, request: Request) -> None: ...
    def trim(self, trims: list[KvTrim]) -> None: ...
    # Whether a sequence's KV lets it go on at `position` (a reused prefix: see runner.py).
    def continues(self, seq_id: int, position: int) -> bool: ...
    # Warm memory (only with a PromptStore): a sequence's KV state as bytes (state_size: how
    # many, before they are copied), and back into an empty sequence (False: refused, the
    # sequence left empty).
    def state_size(self, seq_id: int) -> int: ...
    def save(self, seq_id: int) -> bytearray: ...
    def restore(self, seq_id: int, data: bytearray) -> bool: ...
    # The tokens sampled for each chunk that samples: one, or a draft's verified run.
    def execute(self, chunks: list[Chunk]) -> list[list[int]]: ...
    # A draft model's guesses (speculation): for each (seq id, the stream's text, k), up to k
    # tokens; drafts_from_model False: the model has none, and propose_drafts gives nothing.
    drafts_from_model: bool
    draft_round_s: float | None  # the last propose_drafts' seconds per drafting decode

    def propose_drafts(self, wants: list[tuple[int, object, int]]) -> list[list[int]]: ...
    # After execute(), for a request whose params ask for logprobs: its index-th sampled token's.
    def logprobs(self, request: Request, token: int, index: int = 0) -> StepLogprobs: ...
    # Images (inference.engine.vision), only where takes_images: on the encoder thread.
    # takes_images: bool (a runner without the attribute takes none)
    # def read_images(self, prompt: str, images, add_special: bool) -> MediaPrompt: ...
    # def encode_image(self, prompt: MediaPrompt, index: int) -> numpy.ndarray: ...
    # def free_media(self, prompt: MediaPrompt) -> None: ...
    # The images of the prompt a sequence now holds (on admission, before its KV edits): where
    # an image takes fewer KV positions than tokens (M-RoPE), its trims go through them.
    # def hold(self, seq_id: int, spans: list[ImageSpan] | None) -> None: ...
    # image_width: int (an image's embeddings' width; without it none are kept on disk)
    def info(self) -> dict: ...
    def close(self) -> None: ...


class Engine:
    def __init__(
        self,
        runner: Runner,
        *,
        itl_target: float = 0.1,
        background_itl_target: float = 1.0,
        max_queue: int = 64,
        chunked_prefill: bool = True,
        prefix_cache: bool = True,
        reserve: int | None = None,
        telemetry_window: float = 10.0,
        name: str = "",
        prompts: PromptStore | None = None,
        speculation: Speculation | None = None,
    ):
        """`itl_target`: how long a step that carries an interactive stream may take (seconds);
        `background_itl_target`: the same for steps whose streams are all background; `reserve`:
        sequence slots kept for a person's first request (None: one from four slots up);
        `prompts`: the tiers that keep what sequences have read (None: slots only);
        `speculation`: drafting and verifying several tokens a step (None: one a step)."""
        self.runner = runner
        self.name = name
        self.itl_target = itl_target
        self.budget = TokenBudget(itl_target, runner.n_batch, chunked=chunked_prefill,
                                  background_itl_target=background_itl_target)  # fmt: skip
        self.costs = RestoreCosts()
        self.prompts = prompts
        if prompts is not None:
            prompts.on_fetched = lambda result: self._inbox.put(("fetched", result))
            # A save's size before the first is measured: the KV buffer per cell llama.cpp
            # allocated, and the entries found on disk.
            kv = sum(((runner.info().get("buffers") or {}).get("kv") or {}).values())
            if kv and runner.n_ctx:
                self.costs.observe_save(runner.n_ctx, kv, None)
            for entry in prompts.held()[-8:]:
                self.costs.observe_save(entry.n_tokens, entry.n_bytes, None)
            # Forgets recorded in the worker's log (tiers.forgets) are applied here, slots
            # included; the first look covers those recorded since the store opened.
            prompts.on_forgets = lambda: self._inbox.put(("forgets",))
        self.scheduler = Scheduler(
            n_ctx=runner.n_ctx,
            n_slots=runner.n_slots,
            ctx_per_seq=runner.ctx_per_seq,
            budget=self.budget,
            max_queue=max_queue,
            prefix_cache=prefix_cache,
            reserve=reserve,
            tiers=prompts,
            costs=self.costs,
            speculation=speculation,
        )
        self.speculation = speculation
        self.telemetry = Telemetry(window_s=telemetry_window)
        self.max_queue = max_queue
        # When the last step's run ended, while work went on since: the time from it to the
        # next run is the work between steps that a reader's ITL holds (budget.py, 6.).
        self._last_run_end: float | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[str, RequestHandle] = {}
        self._paused: set[str] = set()  # ids of the requests the last step left out by priority
        self._streams: dict[str, TextStream] = {}
        self._pending = 0  # submitted, not yet admitted: checked at submit for a fast "busy"
        self._live: set[str] = set()  # ids of requests not yet ended (guarded by _pending_lock)
        self._pending_lock = threading.Lock()
        self._embedding = 0  # embeddings asked for and not yet computed (guarded by the lock)
        self._counts = self.scheduler.counts()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._exited = False  # the loop has ended (set under _pending_lock)
        self._close_on_exit = False  # shutdown timed out: the loop closes the runner as it ends
        self.started_at = time.perf_counter()
        self.last_active = self.started_at
        # Requests whose images the encoder is reading, by id (the engine thread's: see
        # _handle_message); the encoder, where the runner takes images.
        self._preparing: dict[str, Request] = {}
        # Encoded images outlive the process in the tiers' disk tier (PromptStore.read_image).
        self._encoder = (Encoder(runner, self._images_read, name=name, shelf=prompts)
                         if getattr(runner, "takes_images", False) else None)  # fmt: skip
        if prompts is not None:
            self._inbox.put(("forgets",))

    # --- the caller's side (any thread) ------------------------------------------------------

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name=f"engine-{self.name}", daemon=True)
        self._thread.start()
        if self._encoder is not None:
            self._encoder.start()
        return self

    def submit(
        self,
        asked: GenerationRequest,
        *,
        load_time: float = 0.0,
        sink: Callable[[Event], None] | None = None,
    ) -> RequestHandle:
        """Queue a request. Raises InvalidParams, PromptTooLong, QueueFull or EngineStopped at
        once. `load_time`: the model load its host charged to it. With a `sink`, the request's
        events are passed to it (on the engine thread) as they happen."""
        accepted = asked.accepted_perf()
        if self._stopping.is_set() or self._thread is None:
            raise EngineStopped("the engine is not running")
        if getattr(self.runner, "ranks", False):
            from inference.engine.reranking import IS_A_RERANKER

            raise InvalidParams("model", IS_A_RERANKER)
        if asked.media:
            return self._submit_with_images(asked, accepted, load_time, sink)
        prompt = asked.prompt
        ids = (self.runner.tokenize(prompt, asked.add_special) if isinstance(prompt, str)
               else list(prompt))  # fmt: skip
        if not ids:
            raise PromptTooLong("the prompt is empty")
        if not isinstance(prompt, str) and any(is_media(token) for token in ids):
            # Negative ids are images' positions (vision.media_ids): only the encoder makes them.
            raise Refused("the prompt's token ids must not be negative", kind=RefusalKind.INVALID,
                          field="prompt")  # fmt: skip
        limit = self.runner.ctx_per_seq
        if len(ids) >= limit:
            raise PromptTooLong(
                f"the prompt is {len(ids)} tokens but the context holds {limit} tokens per "
                f"sequence (prompt and answer together)"
            )
        self.runner.validate(asked.params)  # a grammar llama.cpp cannot parse is refused here
        request = Request(
            id=asked.request_id,
            prompt_ids=ids,
            params=asked.params,
            accepted_at=accepted,
            cache_key=asked.cache_key,
            cache_partition=asked.cache_partition,
            load_time=load_time,
            priority=asked.priority,
            share=asked.share,
        )
        return self._hand_in(request, sink, "submit")

    def _hand_in(self, request: Request, sink: Callable[[Event], None] | None, kind: str,
                 then: Callable[[], None] | None = None) -> RequestHandle:  # fmt: skip
        """Queue a checked request for the engine thread (message `kind`), and `then` run
        what must follow it under the same lock. Checked and queued under the lock the loop
        takes when it stops, so a request is either refused here or seen by the loop's last
        drain: never silently left behind."""
        handle = RequestHandle(request.id, self.cancel, sink, set_priority=self.set_priority)
        with self._pending_lock:
            if self._stopping.is_set():
                raise EngineStopped("the engine is not running")
            if request.id in self._live:
                raise ValueError(f"request id {request.id!r} is already in use")
            if self._pending >= self.max_queue:
                self.telemetry.record_outcome("rejected")
                raise QueueFull(f"the engine is busy: {self._pending} requests are waiting")
            self._pending += 1
            self._live.add(request.id)
            self._inbox.put((kind, request, handle))
            if then is not None:
                then()
        return handle

    def _submit_with_images(self, asked: GenerationRequest, accepted: float, load_time: float,
                            sink: Callable[[Event], None] | None) -> RequestHandle:  # fmt: skip
        """A request with images: refused at once where the model takes none or a picture's
        header is unreadable or too large; otherwise queued for the encoder thread, which
        reads its prompt and images beside the steps (vision.Encoder) and hands it to the
        scheduler (_handle_message: "prepared"). What only the read can tell (a picture that
        does not decode, a prompt too long with its image tokens) ends it with an error event
        of that refusal's kind."""
        self._check_takes_images(asked.model, asked.media)
        self.runner.validate(asked.params)
        request = Request(id=asked.request_id, prompt_ids=[], params=asked.params,
                          accepted_at=accepted, cache_key=asked.cache_key,
                          cache_partition=asked.cache_partition, load_time=load_time,
                          priority=asked.priority, share=asked.share)  # fmt: skip
        # The engine thread learns of it ("preparing") before the encoder can be done with it.
        job = MediaJob(request, asked.prompt, asked.media, asked.add_special)
        return self._hand_in(request, sink, "preparing", then=lambda: self._encoder.submit(job))

    def _check_takes_images(self, model: str | None, images: tuple[Image, ...]) -> None:
        """Refuse images where the model takes none, or a picture whose header is unreadable
        or too large (vision.check_pictures)."""
        name = model or "this model"
        if self._encoder is None:
            raise Refused(f"{name} does not take images: it has no vision projector",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        problem = getattr(self.runner, "image_problem", None)
        if problem:
            raise Refused(f"{name} does not take images: {problem}",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        check_pictures(images)

    def _images_read(self, job: MediaJob, result: object) -> None:
        """The encoder is done with a request's images (on its thread): to the engine thread."""
        with self._pending_lock:
            if not self._exited:  # else the loop's end has failed it already
                self._inbox.put(("prepared", job.request, result))

    def cancel(self, request_id: str) -> None:
        self._inbox.put(("cancel", request_id))

    def set_priority(self, request_id: str, priority: Priority) -> None:
        """Change a request's priority from the next step on (a chat answer whose page went
        away is background until a reader attaches again); thread-safe, unknown ids ignored."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        self._inbox.put(("priority", request_id, priority))

    def forget_prompts(self, partition: str | None = None, *, everything: bool = False) -> Future:
        """Drop what `partition`'s prompts left in idle slots and in the tiers (everything=True:
        everyone's), between steps; the Future's result is the number of tier entries dropped.
        Running requests keep their KV until they end (then it is kept anew)."""
        future: Future = Future()
        self._inbox.put(("forget", partition, everything, future))
        return future

    def persist_prompts(self, timeout: float) -> int:
        """After shutdown(): write what the RAM tier holds to disk (within `timeout` seconds)
        and let go of the disk tier; returns the entries written."""
        if self.prompts is None:
            return 0
        try:
            return self.prompts.flush(timeout)
        finally:
            self.prompts.close()

    def on_engine_thread(self, fn: Callable[[], object]) -> Future:
        """Run `fn` between steps on the thread that owns the runner; its result or exception
        comes back in the Future. llama.cpp's OpenMP threads belong to the thread that calls
        it: one decode from another thread (a warm-up, say) left every later step of the
        engine 35 % slower on 2 cores."""
        future: Future = Future()
        self._inbox.put(("call", fn, future))
        return future

    def embed(
        self, inputs: list[str | list[int]], *, truncate: bool = True, query: str | None = None,
        truncate_left: bool = False,
    ) -> Future:  # fmt: skip
        """Embeddings of texts or token arrays (inference.engine.embedding), or with a `query`
        a reranker's scores of the documents `inputs` (inference.engine.reranking): checked at
        once (InvalidParams, PromptTooLong), computed on the engine thread between steps; the
        Future's result is an Embedding. The engine reads as busy until it is done."""
        from inference.engine.embedding import start  # that module builds on this one

        if self._stopping.is_set() or self._thread is None:
            raise EngineStopped("the engine is not running")
        with self._pending_lock:
            self._embedding += 1
        try:
            future = start(self, inputs, truncate=truncate, query=query,
                           truncate_left=truncate_left)
        except BaseException:
            self._embedded(None)
            raise
        future.add_done_callback(self._embedded)
        return future

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 with_pieces: bool = False, images: tuple[Image, ...] = ()) -> Future:  # fmt: skip
        """The token ids of `text` as a prompt gets them (inference.engine.tokens): checked at
        once (InvalidParams), computed on the engine thread, or with `images` read on the
        encoder thread and not encoded; the Future's result is a Tokens."""
        from inference.engine import tokens

        if self._stopping.is_set() or self._thread is None:
            raise EngineStopped("the engine is not running")
        return tokens.tokenize(self, text, add_special=add_special, parse_special=parse_special,
                               with_pieces=with_pieces, images=images)  # fmt: skip

    def count_images(self, text: str, images: tuple[Image, ...], add_special: bool) -> Future:
        """The ids of a prompt with images (inference.engine.tokens, rule 3): refused at once
        as a request with these images would be, else read by the encoder, never encoded."""
        self._check_takes_images(None, images)
        return self._encoder.count(text, images, add_special)

    def detokenize(self, ids: list[int]) -> Future:
        """The text of token ids (inference.engine.tokens); ids outside the vocabulary are an
        InvalidParams at once. The Future's result is a str."""
        from inference.engine import tokens

        if self._stopping.is_set() or self._thread is None:
            raise EngineStopped("the engine is not running")
        return tokens.detokenize(self, ids)

    def _embedded(self, future: Future | None) -> None:
        with self._pending_lock:
            self._embedding -= 1
        self.last_active = time.perf_counter()

    def snapshot(self) -> dict:
        now = time.perf_counter()
        counts = self._counts
        return {
            "name": self.name,
            "model": self.runner.info(),
            "itl_target": self.itl_target,
            "background_itl_target": self.budget.background_itl_target,
            "reserve": self.scheduler.reserve,
            "chunked_prefill": self.budget.chunked,
            "step_cost": {"overhead": self.budget.cost.overhead,
                          "per_token": self.budget.cost.per_token},  # fmt: skip
            "token_budget": self.budget.tokens(counts["decoding"]),
            "queue_depth": counts["waiting"],
            "active_sequences": counts["prefilling"] + counts["decoding"],
            "prefilling": counts["prefilling"],
            "decoding": counts["decoding"],
            "paused": counts["paused"],
            "slots": self.runner.n_slots,
            "kv_used": counts["kv_used"],
            "kv_reserved": counts["kv_reserved"],
            "kv_size": counts["kv_size"],
            "kv_fill": counts["kv_used"] / counts["kv_size"] if counts["kv_size"] else 0.0,
            "idle_s": now - self.last_active if not counts["prefilling"] + counts["decoding"]
            else 0.0,
            "streams": self._streams_now(now),
            "prompt_cache": self._prompt_cache_now(),
            "speculation": self.speculation.reading() if self.speculation is not None
            else {"enabled": False},
            # The image encoder (vision.Encoder): images encoding now, totals, its cache.
            "vision": ({**self._encoder.reading(), "requests": len(self._preparing)}
                       if self._encoder is not None else None),  # fmt: skip
            **self.telemetry.snapshot(now),
            "shares": self._shares_now(now),
        }

    def _prompt_cache_now(self) -> dict:
        """The tiers against their bounds, their use since load, the measured restore rates,
        and the conversations kept (digests, for split mode's router: resident and tiers)."""
        reading = {"enabled": self.prompts is not None and self.prompts.enabled,
                   "use": self.telemetry.reuse(), **self.costs.rates()}  # fmt: skip
        keys = [s.cache_key for s in list(self.scheduler.cache.slots) if s.cache_key]
        if self.prompts is not None:
            reading.update(self.prompts.stats())
            keys += self.prompts.conversations(MAX_WARM_ROWS)
        reading["conversations"] = list(dict.fromkeys(map(conversation_digest, keys)))[
            :MAX_WARM_ROWS
        ]
        return reading

    def _streams_now(self, now: float) -> list[dict]:
        """Each running request as the dashboard's live table shows it: decode tok/s over the
        last STREAM_RATE_S (so a stalled stream reads low at once), or how far its prompt is.
        Read from another thread: copies of the lists, and only fields a step sets whole."""
        rows = []
        for request in list(self.scheduler.running)[: self.runner.n_slots]:
            times = request.token_times
            n = len(times)
            recent = 0
            while recent < n and times[n - 1 - recent] >= now - STREAM_RATE_S:
                recent += 1
            since = min(STREAM_RATE_S, now - times[0]) if n else 0.0
            rows.append({
                "id": request.id[:8],
                "priority": request.priority,
                "share": request.share,
                "paused": request.paused,
                "phase": "decoding" if n else "prefilling",
                "prompt_tokens": request.prompt_len,
                "cached_tokens": request.cached_tokens,
                "computed": min(request.num_computed, request.prompt_len),
                "output_tokens": len(request.output_ids),
                "max_tokens": request.max_new_tokens,
                "tps": recent / since if since >= 0.25 else None,  # None: too new to say
                "last_token_ago": now - times[-1] if n else None,
                "age": now - request.accepted_at,
            })  # fmt: skip
        return rows

    def _shares_now(self, now: float) -> list[dict]:
        """Per (share, priority): what it has running, waiting and paused, and the tokens it was
        served over the telemetry window; active rows first, then the most served, at most
        MAX_SHARE_ROWS (the dashboard's table and /metrics stay bounded)."""
        rows: dict[tuple, dict] = {}

        def row(share, priority) -> dict:
            return rows.setdefault((share, priority), {
                "share": share, "priority": priority, "running": 0, "waiting": 0, "paused": 0,
                "tokens_recent": 0,
            })  # fmt: skip

        for request in list(self.scheduler.running):
            entry = row(request.share, request.priority)
            entry["running"] += 1
            entry["paused"] += request.paused
        for request in list(self.scheduler.waiting):
            row(request.share, request.priority)["waiting"] += 1
        for (share, priority), tokens in self.telemetry.served(now).items():
            row(share, priority)["tokens_recent"] += tokens
        ordered = sorted(rows.values(), key=lambda r: (r["running"] + r["waiting"] > 0,
                                                       r["tokens_recent"],
                                                       r["running"] + r["waiting"]),
                         reverse=True)  # fmt: skip
        return ordered[:MAX_SHARE_ROWS]

    def info(self) -> dict:
        """The loaded model's facts (read once at load by the runner)."""
        return self.runner.info()

    @property
    def alive(self) -> bool:
        """The loop is running and takes requests."""
        return self._thread is not None and not self._stopping.is_set() and not self._exited

    @property
    def busy(self) -> bool:
        counts = self._counts
        return bool(self._pending or self._embedding or counts["prefilling"] or counts["decoding"])

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running end with an error event."""
        self._stopping.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)
        with self._pending_lock:
            # A step still running past the timeout: closing now would free the model under
            # llama_decode, so the loop closes the runner itself when that step ends.
            self._close_on_exit = self._thread is not None and not self._exited
            if self._close_on_exit:
                log.warning("engine %s is still in a step; it closes when the step ends", self.name)
                return
        if not self._stop_encoder(timeout):
            return
        self.runner.close()

    def _stop_encoder(self, timeout: float) -> bool:
        """Let the encoder finish the image in hand and stop; False if it is still encoding
        (then the runner is left open: closing it would free the projector under it)."""
        if self._encoder is None:
            return True
        self._encoder.stop(timeout)
        if self._encoder.alive:
            log.warning("engine %s: the image encoder is still running; not closing", self.name)
            return False
        return True

    # --- the engine thread -------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self.scheduler.has_work:
                    self._last_run_end = None  # an idle wait is no time between two steps
                self._drain_inbox(block=not self.scheduler.has_work)
                if self.scheduler.has_work and not self._stopping.is_set():
                    self.step()
        except Exception:  # a bug in the engine itself: fail everyone loudly rather than hang
            log.exception("engine loop crashed")
        finally:
            with self._pending_lock:  # after this, submit() refuses (see there)
                self._stopping.set()
            for message in self._drain_remaining():
                if message[0] in ("submit", "preparing"):  # submitted but never seen by the loop
                    _, request, handle = message
                    self._handles[request.id] = handle
                    self._fail(request, "the engine stopped")
                elif message[0] in ("call", "forget"):
                    message[-1].set_exception(EngineStopped("the engine stopped"))
            for request in list(self._preparing.values()):  # the encoder's: it drops them
                self._fail(request, "the engine stopped")
            self._preparing.clear()
            for request in list(self.scheduler.running) + list(self.scheduler.waiting):
                try:  # out of the scheduler too, or the engine would read as busy forever
                    self.scheduler.cancel(request.id)
                except Exception:  # noqa: BLE001 - the scheduler may be what broke
                    log.exception("dropping %s", request.id)
                self._fail(request, "the engine stopped")
            self._keep_resident()
            if self.prompts is not None:  # forgets from now on are the store's alone
                self.prompts.on_forgets = None
            self._counts = self.scheduler.counts()
            with self._pending_lock:
                self._exited = True
                close = self._close_on_exit
            if close and self._stop_encoder(10.0):
                self.runner.close()

    def _drain_remaining(self) -> list[tuple]:
        messages = []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _drain_inbox(self, block: bool) -> None:
        try:
            message = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle_message(message)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
        self._counts = self.scheduler.counts()

    def _handle_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "submit":
            _, request, handle = message
            self._handles[request.id] = handle
            self._enqueue(request)
        elif kind == "preparing":  # its images are with the encoder (vision.Encoder)
            _, request, handle = message
            self._handles[request.id] = handle
            self._preparing[request.id] = request
            handle.deliver(PhaseEvent(request.id, "encoding"))
        elif kind == "prepared":
            self._prepared(message[1], message[2])
        elif kind == "cancel":
            request = self._preparing.pop(message[1], None)
            if request is not None:  # the encoder drops it (before its next image)
                if self._encoder is not None:
                    self._encoder.cancelled.add(request.id)
                self._end(request, Status.CANCELLED, "cancelled")
                return
            request = self.scheduler.cancel(message[1])
            if request is not None:
                self._end(request, Status.CANCELLED, "cancelled")
        elif kind == "priority":
            request = self.scheduler.find(message[1])
            if request is not None:
                request.priority = message[2]
        elif kind == "call":
            _, fn, future = message
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - the caller gets it
                future.set_exception(exc)
        elif kind == "fetched":
            result: DiskResult = message[1]
            if result.ok:
                self.costs.observe_read(result.entry.n_bytes, result.seconds)
            self.scheduler.fetched()
        elif kind == "forget":
            _, partition, everything, future = message
            self.scheduler.forget(partition, everything)
            if self.speculation is not None:  # what its answers taught the n-gram table too
                self.speculation.forget(partition, everything=everything)
            dropped = self.prompts.forget(partition, everything=everything) if self.prompts else 0
            if self._encoder is not None:  # its encoded images (the tiers drop those on disk)
                self._encoder.cache.forget(partition, everything=everything)
            self._apply_forgets()  # its record too (kept_prompts writes it first): said done
            future.set_result(dropped)
        elif kind == "forgets":
            self._apply_forgets()

    def _apply_forgets(self) -> None:
        """The forgets recorded since the last look (tiers.forgets), in the tiers and slots."""
        if self.prompts is None:
            return
        for forget in self.prompts.apply_forgets():
            self.scheduler.forget(forget.partition, forget.everything)
            if self._encoder is not None:
                self._encoder.cache.forget(forget.partition, everything=forget.everything)
            if self.speculation is not None:
                self.speculation.forget(forget.partition, everything=forget.everything)

    def _enqueue(self, request: Request) -> None:
        """A request whose prompt is read, into the scheduler's queue."""
        self._streams[request.id] = TextStream(request.params.stop)
        try:
            self.runner.prepare(request)
            self.scheduler.add(request)
        except Exception as exc:  # noqa: BLE001 - reported to the request, loop goes on
            self._fail(request, str(exc))
            return
        self._deliver(request, PhaseEvent(request.id, "waiting"))

    def _prepared(self, request: Request, result: object) -> None:
        """The encoder read a request's prompt and images: a MediaPrompt with every image's
        embeddings, or the refusal that ends it (that request only)."""
        if self._preparing.pop(request.id, None) is None:  # cancelled meanwhile
            if self._encoder is not None:
                self._encoder.cancelled.discard(request.id)
            return
        if isinstance(result, EncoderStopped):
            self._fail(request, "the engine stopped")
            return
        if not isinstance(result, MediaPrompt):
            refused = Refused.of(result if isinstance(result, BaseException) else
                                 RuntimeError("the images could not be read"))  # fmt: skip
            self._fail(request, refused.message, code=refused.kind)
            return
        limit = self.runner.ctx_per_seq
        if not result.ids or len(result.ids) >= limit:
            self._fail(request, f"the prompt is {len(result.ids)} tokens with its images but the "
                       f"context holds {limit} tokens per sequence (prompt and answer together)",
                       code=RefusalKind.TOO_LONG)  # fmt: skip
            return
        request.prompt_ids = result.ids
        request.media = result.spans
        self.telemetry.record_images(request.encode.encoded, request.encode.cached,
                                     request.encode.seconds, request.encode.image_tokens)
        self._enqueue(request)

    def step(self) -> None:
        """One iteration: schedule → run → update."""
        self._model_drafts()
        now = time.perf_counter()
        plan = self.scheduler.schedule(now)
        if plan.admitted:
            # Counts before the pending decrement: `busy` must never read idle while an
            # admitted request prefills (the keep-alive sweep would unload the model under it).
            self._counts = self.scheduler.counts()
        for request in plan.admitted:
            self._admitted(request)
        self._report_queue(now)
        self._report_paused(plan.paused)
        self._apply_kv(plan)
        for request in plan.admitted:
            self.telemetry.record_reuse(request.cached_tier, request.cached_tokens,
                                        request.restore_time, self._saved_seconds(request))
        if not plan.chunks:
            self._last_run_end = None
            self._counts = self.scheduler.counts()
            return
        if self._encoder is not None:  # the steps leave the encoder its cores while it works
            self.runner.share_cores(self._encoder.busy > 0)
        started = time.perf_counter()
        if self._last_run_end is not None:  # less what the budget counts apart (KV, drafts)
            copies = plan.saved_s + plan.restored_s + self.scheduler.drafting_s
            self.budget.observe_between(started - self._last_run_end - copies)
        try:
            sampled = self.runner.execute(plan.chunks)
        except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests only
            log.exception("llama_decode failed")
            for chunk in plan.chunks:
                if not chunk.request.status.done:
                    self.scheduler.finish(chunk.request, keep_kv=False)
                    self._fail(chunk.request, f"the model failed to run this step: {exc}")
            self._last_run_end = None
            self._counts = self.scheduler.counts()
            return
        ended = time.perf_counter()
        self.budget.observe(plan.n_tokens, ended - started, plan.predicted_s,
                            verified=bool(plan.draft_tokens))  # fmt: skip
        self._update(plan, sampled, started, ended)
        if plan.draft_tokens:  # whether the drafts paid for themselves (speculation/policy, 4.)
            spent = ended - started + self.scheduler.drafting_s  # a draft model's time too
            self.speculation.settle(plan.undrafted_s, spent, plan.decodes,
                                    self.budget.between_steps)  # fmt: skip
        self.last_active = self._last_run_end = ended
        self._counts = self.scheduler.counts()

    def _model_drafts(self) -> None:
        """Before the step is planned: the draft model's guesses for the decoding streams
        whose expected saving beats their cost (speculation.policy.model_draft_length). The
        time they take is the step's too: the scheduler leaves it out of the step's budget."""
        self.scheduler.drafting_s = 0.0
        speculation = self.speculation
        if speculation is None or not speculation.enabled or not self.runner.drafts_from_model:
            return
        wants, asked = [], []
        for request in self.scheduler.running:
            if request.status != Status.DECODING or request.speculation is None:
                continue
            room = self.scheduler.draft_room(request)
            k = speculation.model_draft_length(request, self.budget.predict_verified, room)
            if k:
                history = request.speculation.history
                wants.append((request.seq_id, history.ids[: history.length], k))
                asked.append(request)
        if not wants:
            return
        started = time.perf_counter()
        try:
            drafts = self.runner.propose_drafts(wants)
        except Exception:  # noqa: BLE001 - a draft is a guess: without one the step goes on
            log.exception("the draft model failed")
            drafts = [[] for _ in wants]
        seconds = time.perf_counter() - started
        speculation.model_drafted(asked, drafts, seconds, self.runner.draft_round_s)
        self.scheduler.drafting_s = seconds

    # --- KV edits and warm memory ----------------------------------------------------------

    def _apply_kv(self, plan: StepPlan) -> None:
        """The plan's KV edits, in order: saves into the tiers, trims, restores (their seconds
        are the step's: `plan.saved_s`, `plan.restored_s`, in its record); then each request
        admitted with cached tokens is checked to go on from them (runner.continues: a model
        with sliding-window layers may have dropped what an old prefix needs)."""
        if self._encoder is not None:  # the images whose KV positions the edits speak of
            for request in plan.admitted:
                self.runner.hold(request.seq_id, request.media)
        for op in plan.kv_ops:
            if isinstance(op, KvTrim):
                self.runner.trim([op])
            elif isinstance(op, KvSave):
                plan.saved_s += self._save(op)
            elif isinstance(op, KvRestore):
                started = time.perf_counter()
                self._restore(op, plan)
                plan.restored_s += time.perf_counter() - started
        for request in plan.admitted:
            if request.cached_tokens and not self.runner.continues(request.seq_id,
                                                                   request.num_computed):
                log.info("%s: %d cached tokens cannot be reused here (sliding-window or "
                         "recurrent layers); reading the prompt", self.name,
                         request.cached_tokens)  # fmt: skip
                self._read_cold(request, plan)

    def _save(self, op: KvSave, wait: float = 0.0) -> float:
        """A sequence's KV into the RAM tier, in room taken there before it is copied (none
        now: it is not kept); returns the seconds it took. `wait`: how long the room may be
        waited for (never in a step: the scheduler charged the step for the copy alone)."""
        store = self.prompts
        if store is None or store.covers(op.partition, op.tokens):
            return 0.0
        started = time.perf_counter()
        size = 0
        try:
            size = self.runner.state_size(op.seq_id)
            if not store.reserve(size, wait):
                return time.perf_counter() - started
            data = self.runner.save(op.seq_id)
        except Exception:  # noqa: BLE001 - losing a kept prompt costs a read, nothing more
            log.exception("saving sequence %d for the tiers", op.seq_id)
            if size:
                store.release(size)
            return time.perf_counter() - started
        seconds = time.perf_counter() - started
        self.costs.observe_save(len(op.tokens), len(data), seconds)
        store.put(op.partition, op.cache_key, op.tokens, data, reserved=size)
        return seconds

    def _restore(self, op: KvRestore, plan: StepPlan) -> None:
        request = next(r for r in plan.admitted if r.id == op.request_id)
        started = time.perf_counter()
        try:
            restored = self.runner.restore(op.seq_id, op.data)
        except Exception:  # noqa: BLE001 - a cold read instead, below
            log.exception("restoring a kept prompt")
            restored = False
        seconds = time.perf_counter() - started
        if restored:
            self.runner.trim([KvTrim(op.seq_id, op.keep)])
            self.costs.observe_restore(len(op.data), seconds)
            request.restore_time = seconds + (op.entry.read_seconds if request.fetched else 0.0)
            return
        # Never a wrong answer: the entry goes, the sequence is emptied, and the request reads
        # its whole prompt from the next step on (its chunk in this one is dropped).
        log.warning("%s: llama.cpp refused kept prompt %s (%d tokens); reading the prompt again",
                    self.name, op.entry.id, op.entry.n_tokens)  # fmt: skip
        if self.prompts is not None and op.data:  # its own state, refused: it is unusable
            self.prompts.discard(op.entry)
        self._read_cold(request, plan)

    def _read_cold(self, request: Request, plan: StepPlan) -> None:
        """Its cached tokens cannot be used: its sequence is emptied and it reads its whole
        prompt from the next step on (its chunk in this one is dropped). Never a wrong answer."""
        self.runner.trim([KvTrim(request.seq_id, 0)])
        plan.chunks = [c for c in plan.chunks if c.request is not request]
        request.num_computed = request.cached_tokens = 0
        request.cached_tier = None
        request.restore_time = 0.0

    def _keep_resident(self) -> None:
        """The runner stops: what idle slots hold goes into the tiers (engine thread, before
        the runner is closed)."""
        try:
            for op in self.scheduler.keep_all():
                self._save(op, wait=KEEP_WAIT_S)
        except Exception:  # noqa: BLE001 - a stop must not fail for it
            log.exception("keeping what the slots hold")

    def _saved_seconds(self, request: Request) -> float:
        """What reusing its cached tokens saved: reading them again less restoring them."""
        read = request.cached_tokens * self.budget.seconds_per_prompt_token()
        return max(0.0, read - request.restore_time)

    def _admitted(self, request: Request) -> None:
        if self.speculation is not None:
            self.speculation.start(request)
        with self._pending_lock:
            self._pending -= 1
        self._deliver(request, PhaseEvent(request.id, "prefilling"))
        self._deliver(request, self._prefill_progress(request))

    def _report_queue(self, now: float) -> None:
        """Tell each request still waiting its place in the admission order (fair share and
        priority: a newcomer may go ahead of it), when that place changed."""
        for ahead, request in enumerate(self.scheduler.queue(now)):
            if request.queue_ahead != ahead:
                request.queue_ahead = ahead
                self._deliver(request, QueueEvent(request.id, ahead))

    def _report_paused(self, paused: list[Request]) -> None:
        """Tell a running request that its tokens stopped for interactive work, once per pause
        (its next token or prefill progress says that it runs again)."""
        ids = {request.id for request in paused}
        for request in paused:
            if request.id not in self._paused:
                self._deliver(request, PausedEvent(request.id))
        self._paused = ids

    @staticmethod
    def _prefill_progress(request: Request) -> PrefillEvent:
        done = min(request.num_computed, request.prompt_len)
        return PrefillEvent(request.id, done, request.prompt_len, request.cached_tokens)

    def _update(self, plan: StepPlan, sampled: list[list[int]], started: float, ended: float):
        # 1. The step's figures, recorded before any of its events leaves: a client that reads
        #    /metrics as soon as its answer is done finds the answer's last step counted.
        prompt_tokens = decode_tokens = image_tokens = 0
        served: dict[tuple[str | None, str], int] = {}
        for chunk in plan.chunks:
            request = chunk.request
            key = (request.share, request.priority)
            served[key] = served.get(key, 0) + chunk.size
            if request.status == Status.PREFILLING:
                prompt_tokens += len(chunk.tokens)
                if request.media:
                    image_tokens += sum(1 for token in chunk.tokens if is_media(token))
            else:
                decode_tokens += chunk.size
        self.telemetry.record_step(
            ended, prompt_tokens, sum(len(tokens) for tokens in sampled), len(plan.chunks),
            ended - started, decode_tokens, background_decode=plan.background_decodes,
            interactive=plan.interactive, paused=len(plan.paused), served=served,
            verify=plan.draft_tokens, image=image_tokens,
            encoding=self._encoder.busy if self._encoder is not None else 0,
            save_s=plan.saved_s, restore_s=plan.restored_s,
            target_s=plan.target_s, predicted_s=plan.predicted_s,
        )  # fmt: skip
        # 2. Each request takes its tokens: progress, tokens, and its end where it ends.
        results = iter(sampled)
        speculation = self.scheduler.speculation
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed += len(chunk.tokens)
            if request.status == Status.PREFILLING:
                request.prefill_chunks.append((started, ended, len(chunk.tokens)))
                self._deliver(request, self._prefill_progress(request))
            if not chunk.sample:
                continue
            tokens = next(results)
            if speculation is not None and request.speculation is not None:
                speculation.came(request, tokens, chunk.draft)
            if chunk.draft:
                self._accept_verified(request, chunk, tokens)
            else:
                self._accept_token(request, tokens[0])

    def _accept_verified(self, request: Request, chunk: Chunk, tokens: list[int]) -> None:
        """A speculating stream's tokens from one step (runner.execute): all but the last are
        drafted tokens it kept, whose KV the step wrote. Each is taken as a token of its own
        (stop strings, end of generation and max_tokens cut the run exactly where they would
        without speculation); then the KV past what the sequence holds is removed."""
        kept = len(tokens) - 1
        request.drafted += len(chunk.draft)
        request.draft_accepted += kept
        first = chunk.start + len(chunk.tokens)  # what the sequence holds before the run
        for n, token in enumerate(tokens):
            if request.status.done:
                break
            # Before its n-th token the sequence holds the n drafted tokens kept before it
            # (all but the last output token are in the KV: what a finished turn keeps).
            request.num_computed = first + n
            self._accept_token(request, token, index=n)
        fed = chunk.start + chunk.size
        if request.num_computed < fed:
            self.runner.trim([KvTrim(request.seq_id, request.num_computed)])

    def _accept_token(self, request: Request, token: int, index: int = 0) -> None:
        if request.status == Status.PREFILLING:
            request.status = Status.DECODING
            self._deliver(request, PhaseEvent(request.id, "decoding"))
        if self.runner.is_eog(token):
            self._finish(request, "stop")
            return
        request.output_ids.append(token)
        stream = self._streams[request.id]
        text = stream.feed(self.runner.piece(token))
        sent = time.perf_counter()
        times = request.token_times
        if times:
            self.telemetry.record_token_gap(sent - times[-1], at=sent, priority=request.priority)
        times.append(sent)
        if text:
            self._text_sent(request, sent)
        logprobs = (None if request.params.logprobs is None
                    else self.runner.logprobs(request, token, index))  # fmt: skip
        self._deliver(request, TokenEvent(request.id, text, token, len(request.output_ids) - 1,
                                          logprobs=logprobs))  # fmt: skip
        if stream.stopped:
            self._finish(request, "stop")
        elif len(request.output_ids) >= request.max_new_tokens:
            self._finish(request, "length")

    def _finish(self, request: Request, reason: str) -> None:
        self.scheduler.finish(request, keep_kv=True)
        self._end(request, Status.FINISHED, reason)

    def _end(self, request: Request, status: Status, reason: str) -> None:
        stream = self._streams.pop(request.id, None)
        tail = stream.flush() if stream else ""
        request.text = (stream.text if stream else "")
        request.status = status
        request.finish_reason = reason
        request.finished_at = time.perf_counter()
        if tail:
            self._text_sent(request, request.finished_at)
        if request.admitted_at is None:
            with self._pending_lock:
                self._pending -= 1
        self.runner.release(request)
        if self.speculation is not None:
            self.speculation.finished(request)  # its partition's table learns its answer
        figures = request.figures()
        self.telemetry.record_outcome(reason, figures["total_time"], request.cached_tokens)
        with self._pending_lock:
            self._live.discard(request.id)
        handle = self._handles.pop(request.id, None)
        if handle is not None:
            if tail:  # held-back text that turned out not to be a stop string
                handle.deliver(TokenEvent(request.id, tail, -1, len(request.output_ids) - 1))
            matched = stream.matched if stream else None
            handle.deliver(DoneEvent(request.id, reason, request.text, figures, stop=matched))

    def _fail(self, request: Request, message: str,
              code: RefusalKind = RefusalKind.FAILED) -> None:  # fmt: skip
        if request.status.done:
            return
        self._streams.pop(request.id, None)
        request.status = Status.FAILED
        request.error = message
        request.finish_reason = "error"
        request.finished_at = time.perf_counter()
        if request.admitted_at is None:
            with self._pending_lock:
                self._pending -= 1
        try:
            self.runner.release(request)
        except Exception:  # noqa: BLE001
            log.exception("releasing a failed request")
        self.telemetry.record_outcome("failed")
        with self._pending_lock:
            self._live.discard(request.id)
        handle = self._handles.pop(request.id, None)
        if handle is not None:
            handle.deliver(ErrorEvent(request.id, message, request.figures(), code=code))

    def _deliver(self, request: Request, event) -> None:
        handle = self._handles.get(request.id)
        if handle is not None:
            handle.deliver(event)

    def _text_sent(self, request: Request, at: float) -> None:
        """Text of the answer leaves; the first time, that is its TTFT."""
        if request.first_text_at is None:
            request.first_text_at = at
            self.telemetry.record_first_token(
                request.ttft, request.queue_time or 0.0, request.prefill_time or 0.0, at=at,
                priority=request.priority,
            )
