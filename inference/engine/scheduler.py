"""Which tokens run in the next step: stall-free, phase-aware continuous batching.

The contract, once:
- `schedule()` returns a `StepPlan`: KV trims to apply first, then chunks to run in one
  llama_decode call. Every decoding sequence gets exactly one token in every plan; prompt chunks
  of prefilling sequences fill what is left of the token budget, oldest first; then waiting
  requests are admitted, oldest first, while a slot is free and the KV cache has room.
- A chunk with `sample=True` wants logits for its last token: decodes, and the chunk that
  completes a prompt. The engine appends the sampled token and calls `finish()` when a request
  ends; the scheduler never touches the model.
- KV room is reserved on admission for the whole prompt and every token the request may still
  generate, so a running sequence never runs out of cache mid-stream and nothing is preempted.
"""

from collections import deque
from dataclasses import dataclass, field

from inference.engine.budget import TokenBudget
from inference.engine.prefix_cache import KvTrim, PrefixCache
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.request import Request, Status


class QueueFull(Refused):
    """More requests are waiting than the engine accepts: the caller should answer 'busy'."""

    kind = RefusalKind.BUSY


@dataclass(slots=True)
class Chunk:
    request: Request
    tokens: list[int]
    start: int  # the sequence position of tokens[0]
    sample: bool


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    kv_trims: list[KvTrim] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    decodes: int = 0  # the first `decodes` chunks are one decode token each

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        *,
        n_ctx: int,
        n_slots: int,
        ctx_per_seq: int,
        budget: TokenBudget,
        max_queue: int = 64,
        prefix_cache: bool = True,
    ):
        self.n_ctx = n_ctx
        self.ctx_per_seq = min(ctx_per_seq, n_ctx)
        self.budget = budget
        self.max_queue = max_queue
        self.cache = PrefixCache(n_slots, enabled=prefix_cache)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self._reserved = 0  # KV cells promised to running requests
        self._pending_trims: list[KvTrim] = []

    # --- queue -----------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting")
        self.waiting.append(request)

    def cancel(self, request_id: str) -> Request | None:
        """Remove a request wherever it is, freeing its slot and KV; None if unknown."""
        for request in self.waiting:
            if request.id == request_id:
                self.waiting.remove(request)
                return request
        for request in self.running:
            if request.id == request_id:
                self.finish(request, keep_kv=False)
                return request
        return None

    def find(self, request_id: str) -> Request | None:
        """A request still waiting or running, by id."""
        for request in (*self.waiting, *self.running):
            if request.id == request_id:
                return request
        return None

    def finish(self, request: Request, *, keep_kv: bool) -> None:
        """Take a request out of the running set. With keep_kv its KV stays for the next turn."""
        self.running.remove(request)
        self._reserved -= self._reservation(request)
        kv_tokens = request.kv_tokens if keep_kv and request.num_computed else None
        trim = self.cache.release(request.seq_id, kv_tokens)
        if trim:
            self._pending_trims.append(trim)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._pending_trims)

    # --- the step --------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        decoding = [r for r in self.running if r.status == Status.DECODING]
        plan = StepPlan(kv_trims=self._pending_trims, decodes=len(decoding))
        self._pending_trims = []
        budget = self.budget.tokens(len(decoding))

        # 1. One token for every decoding sequence, always: nobody's stream stalls.
        for request in decoding:
            last = request.output_ids[-1]
            plan.chunks.append(Chunk(request, [last], request.num_computed, True))
        room = budget - len(decoding)

        # 2. Prompt chunks of sequences already prefilling, oldest first.
        for request in self.running:
            if request.status == Status.PREFILLING and room > 0:
                room -= self._add_prompt_chunk(plan, request, room, now)

        # 3. Admit waiting requests in order while a slot and KV room exist.
        while self.waiting and room > 0 and self.cache.has_free_slot():
            request = self.waiting[0]
            if not self._admit(request, plan, now):
                break  # FIFO: the head waits for room rather than being overtaken
            self.waiting.popleft()
            plan.admitted.append(request)
            room -= self._add_prompt_chunk(plan, request, room, now)
        return plan

    def _add_prompt_chunk(self, plan: StepPlan, request: Request, room: int, now: float) -> int:
        # Unchunked, the budget is the whole batch, so a prompt still runs whole when it fits;
        # taking more than `room` would overflow the runner's batch (n_batch).
        take = min(request.remaining_prompt, room)
        start = request.num_computed
        tokens = request.prompt_ids[start : start + take]
        completes = start + take == request.prompt_len
        plan.chunks.append(Chunk(request, tokens, start, completes))
        if request.prefill_started_at is None:
            request.prefill_started_at = now
        return take

    def _reservation(self, request: Request) -> int:
        return request.prompt_len + request.max_new_tokens

    def _admit(self, request: Request, plan: StepPlan, now: float) -> bool:
        slot, reused = self.cache.choose(
            request.prompt_ids, request.cache_key, request.cache_partition
        )
        request.max_new_tokens = min(
            request.params.max_tokens, self.ctx_per_seq - request.prompt_len
        )
        need = self._reservation(request)

        def fits() -> bool:
            idle_elsewhere = self.cache.idle_tokens - len(slot.tokens)
            return self._reserved + need + idle_elsewhere <= self.n_ctx

        while not fits():
            trim = self.cache.evict_one(keep=slot)
            if trim is None:
                return False
            plan.kv_trims.append(trim)
        trim = self.cache.take(slot, reused, request.cache_key, request.cache_partition)
        if trim:
            plan.kv_trims.append(trim)
        self._reserved += need
        request.seq_id = slot.seq_id
        request.cached_tokens = reused
        request.num_computed = reused
        request.admitted_at = now
        request.status = Status.PREFILLING
        self.running.append(request)
        return True

    # --- readings --------------------------------------------------------------------------

    def kv_used(self) -> int:
        """KV cells actually holding tokens now (running sequences and cached turns)."""
        return sum(r.num_computed for r in self.running) + self.cache.idle_tokens

    def counts(self) -> dict[str, int]:
        prefilling = sum(r.status == Status.PREFILLING for r in self.running)
        return {
            "waiting": len(self.waiting),
            "prefilling": prefilling,
            "decoding": len(self.running) - prefilling,
            "kv_used": self.kv_used(),
            "kv_reserved": self._reserved,
            "kv_size": self.n_ctx,
        }
