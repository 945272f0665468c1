"""Which tokens run in the next step: stall-free, phase-aware continuous batching, with fair-share
admission and two priorities (interactive: a person reads the stream; background: an app).

The contract, once. `schedule()` returns a `StepPlan`: KV trims to apply first, then chunks to
run in one llama_decode call, built in these steps (numbered again in `schedule()`):

1. Decodes. Every decoding sequence gets exactly one token, with one exception: when the step
   carries an interactive decoding stream and all the decodes together would overrun the ITL
   target, background decodes ride along only while they fit, the longest-waiting first; one
   that has waited its loose background target always rides.
2. The budget: the ITL target when an interactive stream decodes in the step, else a step at
   the cost curve's knee within the loose background target (budget.py: a flood runs at about
   the machine's best cost per token, and a person who comes waits for a short step only);
   background prompts read with nobody decoding are held to the same size, not the whole batch.
   Each plan carries its target and the time the curve predicts for it (the step log's).
3. Prompts, interactive then background. Within a priority, the sequences already prefilling
   and the waiting requests take the budget's room in turn, the least served share first (a
   waiting request's turn is its fair-share tag, admission.py; a prefilling sequence's is its
   share's usage, and it goes first at equal standing): a prefilling sequence gets its next
   chunk, a waiting request is admitted with its first chunk while a sequence slot is free and
   the KV cache has room. So a person's short prompt is not read after an app's long one. The
   request whose turn it is waits for room rather than being overtaken (no other request of
   its priority is admitted in that step), and no background request is admitted while an
   interactive one waits. While an interactive prompt is being read, background prompts wait
   (a person's TTFT before a batch's throughput).
4. The reserve: the last `reserve` free slots go only to an interactive request whose share has
   nothing running (a person's first request): a flood, of any priority, never holds them all.
   A request the reserve keeps out is passed over, not waited for.
5. Drafts (with speculation, inference.engine.speculation): a decode chunk may carry `draft`,
   tokens guessed to follow its own, verified in this step; how many each stream feeds is the
   policy's, inside the step's budget (what is left of the target after steps 1 to 4).

Warm memory (inference.engine.tiers, when the scheduler has a store): a request admitted in
step 3 takes the longest prefix of its prompt that its partition left anywhere, a resident
slot or a tier, when restoring it costs less than reading it (tiers.costs). An entry on disk is
fetched first, on the disk thread; the request waits for it without holding up anyone else's
turn. A restore goes into an empty slot (what the slot held is saved first) and its time comes
off the step's budget like a prompt chunk's: it waits for a step it fits, beside a person's
stream, unless nobody reads or it has waited the loose background target. KV a slot held is
saved before any edit drops it (`KvSave`), so the tiers learn every prefix the box has read;
the copy is the step's time like a restore's, so beside a person's stream a save waits for a
step it fits, and past the loose background target the KV is dropped unsaved instead: no step
carries a save past the ITL target (the step log's `save_ms`).

Images (inference.engine.vision): a request with images reaches the scheduler with its images
encoded, each image's positions holding pseudo ids, and is scheduled like text, with one rule
more: a prompt chunk is a run of text and then of one image, ending where that image ends (the
runner feeds image rows as an embedding batch after the token batch), and an image the
projector wants whole is never cut (vision.chunk_length). A cached prefix keeps an M-RoPE image
(Qwen2-VL: its rows share one KV position) and one the projector wants whole (non-causal) whole
or not at all (vision.reusable).

A running request that steps 1 and 3 leave out of a plan while interactive work runs is
paused (`Request.paused`): its tokens stop, its KV and its reservation stay, and it resumes
where it was. A chunk with `sample=True` wants logits for its last token: decodes, and the
chunk that completes a prompt. The engine appends the sampled token and calls `finish()` when a
request ends; the scheduler never touches the model. KV room is reserved on admission for the
whole prompt and every token the request may still generate, so a running sequence never runs
out of cache mid-stream and nothing is preempted. Each step's tokens are charged to their
requests' shares, which is what fair-share admission weighs.
"""

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from inference.engine.admission import FairShare
from inference.engine.budget import TokenBudget
from inference.engine.prefix_cache import (
    MIN_REUSE_FRACTION,
    KvOp,
    KvRestore,
    KvSave,
    KvTrim,
    PrefixCache,
)
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.request import Request, Status
from inference.engine.speculation.policy import Speculation
from inference.engine.tiers import Hit, PromptStore, RestoreCosts
from inference.engine.tiers.entries import as_tokens
from inference.engine.vision import chunk_length, reusable

# A background decode that has waited this share of its loose target rides beside a person's
# stream whatever the budget says (step 1): a fixed share, not the budget's measured headroom.
OVERDUE = 0.8


class QueueFull(Refused):
    """More requests are waiting than the engine accepts: the caller should answer 'busy'."""

    kind = RefusalKind.BUSY


@dataclass(slots=True)
class Chunk:
    request: Request
    tokens: list[int]
    start: int  # the sequence position of tokens[0]
    sample: bool
    # Speculation (a decode only): tokens guessed to follow, fed after `tokens` with logits at
    # each; the runner keeps those the model samples itself, in order (speculation/).
    draft: list[int] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.tokens) + len(self.draft)


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    kv_ops: list[KvOp] = field(default_factory=list)  # KV edits, applied in order before the run
    admitted: list[Request] = field(default_factory=list)
    decodes: int = 0  # the first `decodes` chunks are one decode token each
    background_decodes: int = 0  # of those, background streams'
    interactive: bool = False  # an interactive stream decodes in it: the ITL target bound it
    paused: list[Request] = field(default_factory=list)  # running, left out by priority
    reads_interactive: bool = False  # it carries a chunk of an interactive prompt
    # The target that bounded it (budget.target); 0: none did (a person's prompt read with
    # nobody decoding, or prefill unchunked).
    target_s: float = 0.0
    predicted_s: float = 0.0  # its run's seconds as the cost curve predicted them
    undrafted_s: float = 0.0  # the same without its drafts (speculation's payoff weighs both)
    restore_s: float = 0.0  # the predicted seconds of its restores
    save_s: float = 0.0  # the predicted seconds of its saves
    saved_s: float = 0.0  # what its saves took (the engine's measure, for the step's record)
    restored_s: float = 0.0  # what its restores took

    @property
    def kv_s(self) -> float:
        """The predicted seconds of its KV copies, before the run: off the step's budget."""
        return self.restore_s + self.save_s

    @property
    def n_tokens(self) -> int:
        return sum(c.size for c in self.chunks)

    @property
    def draft_tokens(self) -> int:
        return sum(len(c.draft) for c in self.chunks)

    @property
    def kv_trims(self) -> list[KvTrim]:
        return [op for op in self.kv_ops if isinstance(op, KvTrim)]

    @property
    def restores(self) -> list[KvRestore]:
        return [op for op in self.kv_ops if isinstance(op, KvRestore)]


class Admission(Enum):
    ADMITTED = "admitted"
    NO_ROOM = "no room"  # no slot, KV or step time for it: its turn waits
    FETCHING = "fetching"  # its kept prefix is on its way from disk: others go on


def is_interactive(request: Request) -> bool:
    return request.priority == "interactive"


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
        reserve: int | None = None,
        fair_share: FairShare | None = None,
        tiers: PromptStore | None = None,
        costs: RestoreCosts | None = None,
        speculation: Speculation | None = None,
    ):
        self.n_ctx = n_ctx
        self.ctx_per_seq = min(ctx_per_seq, n_ctx)
        self.budget = budget
        self.max_queue = max_queue
        warm = prefix_cache and tiers is not None and tiers.enabled
        self.tiers = tiers if warm else None
        self.costs = costs or RestoreCosts()
        self.speculation = speculation
        self.drafting_s = 0.0  # the draft model's time before this step (engine._model_drafts)
        self.cache = PrefixCache(n_slots, enabled=prefix_cache, keeps_dropped=warm)
        # Slots kept for a person's first request (step 4): one from four slots up, so a small
        # context keeps all its slots for work; never every slot.
        self.reserve = min(1, n_slots // 4) if reserve is None else min(reserve, n_slots - 1)
        self.fair = fair_share or FairShare()
        self.waiting: deque[Request] = deque()  # in arrival order
        self.running: list[Request] = []  # in admission order
        self._reserved = 0  # KV cells promised to running requests
        self._pending_ops: list[KvOp] = []

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

    def queue(self, now: float) -> list[Request]:
        """The waiting requests in the order they would be admitted (admission.py)."""
        return self.fair.order(list(self.waiting), self.running, now)

    def finish(self, request: Request, *, keep_kv: bool) -> None:
        """Take a request out of the running set. With keep_kv its KV stays for the next turn."""
        self.running.remove(request)
        request.paused = False
        self._reserved -= self._reservation(request)
        kv_tokens = request.kv_tokens if keep_kv and request.num_computed else None
        trim = self.cache.release(request.seq_id, kv_tokens)
        if trim:
            self._pending_ops.append(trim)

    def forget(self, partition: str | None, everything: bool = False) -> None:
        """Drop what idle slots keep for `partition` (or anyone): trims for the next step."""
        self._pending_ops.extend(self.cache.forget(partition, everything))

    def keep_all(self) -> list[KvOp]:
        """The saves of everything idle slots keep (the runner stops); warm memory only."""
        return list(self.cache.kept()) if self.tiers is not None else []

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._pending_ops or self.admissible)

    @property
    def admissible(self) -> bool:
        """Someone waits who could be admitted now: not only requests waiting for a fetch."""
        return any(not r.fetching for r in self.waiting)

    def fetched(self) -> None:
        """A read from the disk tier ended (or failed): whoever waited for one tries again."""
        for request in self.waiting:
            request.fetching = False

    # --- the step --------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan(kv_ops=self._pending_ops)
        self._pending_ops = []

        # 1. Decodes: one token for every decoding sequence, so nobody's stream stalls; beside
        # an interactive stream, background decodes only as far as the ITL target allows.
        decoding = [r for r in self.running if r.status == Status.DECODING]
        plan.interactive = any(is_interactive(r) for r in decoding)
        for request in self._decodes(decoding, plan.interactive, now):
            last = request.output_ids[-1]
            plan.chunks.append(Chunk(request, [last], request.num_computed, True))
            plan.background_decodes += not is_interactive(request)
        plan.decodes = len(plan.chunks)

        # 2. The budget, by who reads the streams in this step.
        room = self.budget.tokens(plan.decodes, plan.interactive) - plan.decodes

        # 3. Prompts, interactive then background: in each priority, sequences already
        # prefilling and waiting requests take the room in turn, the least served share first.
        turns = self.fair.turns(list(self.waiting), self.running, now)
        for interactive in (True, False):
            if not interactive and plan.reads_interactive:
                break  # background prompts wait while a person's prompt is read
            claims = [
                (self.fair.usage(r.share, now), 0, i, r)
                for i, r in enumerate(self.running)
                if r.status == Status.PREFILLING and is_interactive(r) == interactive
            ]
            if interactive or not any(is_interactive(r) for r in self.waiting):
                # (no background request is admitted while an interactive one waits)
                claims += [(tag, 1, i, r) for i, (tag, r) in enumerate(turns)
                           if is_interactive(r) == interactive]  # fmt: skip
            if not interactive and plan.interactive:
                # Beside a person's stream, background prompts get what fits the target only:
                # the starvation guard is for work that cannot wait (budget.py, 4.).
                room = min(room, self._room(plan, guard=False))
            elif not interactive and not plan.decodes:
                # Background prompts with nobody decoding: a step at the curve's knee, not the
                # whole batch, so a person who comes meanwhile waits for a short step only.
                room = min(room, self.budget.background_tokens())
            room = self._take_turns(sorted(claims), plan, room, now)

        # 5. Drafts: a decoding stream whose text is predictable feeds guesses at what follows,
        # verified in this same step, as far as they pay and the step's budget allows.
        if self.speculation is not None and self.speculation.enabled and plan.decodes:
            self._draft(plan)
        if plan.chunks:  # what the step log shows beside the step's time (budget.py, 7.)
            bounded = self.budget.chunked and (plan.decodes or not plan.reads_interactive)
            plan.target_s = self.budget.target(plan.interactive) if bounded else 0.0
            plan.predicted_s = (self.budget.predict_verified(plan.n_tokens) if plan.draft_tokens
                                else self.budget.times.predict(plan.n_tokens))  # fmt: skip

        # Charge each share what it was served; mark who priority left out.
        served = {id(c.request) for c in plan.chunks}
        for chunk in plan.chunks:
            chunk.request.scheduled_at = now
            self.fair.charge(chunk.request.share, chunk.size, now)
        carries_interactive = any(is_interactive(c.request) for c in plan.chunks)
        for request in self.running:
            request.paused = carries_interactive and id(request) not in served and (
                not is_interactive(request))  # fmt: skip
            if request.paused:
                plan.paused.append(request)
        self.fair.forget(now)
        return plan

    def _draft(self, plan: StepPlan) -> None:
        """Step 5: each decode chunk's draft, as speculation.policy allocates them."""
        offers = []
        for chunk in plan.chunks[: plan.decodes]:
            request = chunk.request
            room = self.draft_room(request)
            offered = self.speculation.proposal(request, min(room, self.speculation.max_draft))
            if offered:
                offers.append((chunk, offered))
        if not offers:
            return
        # The step's time includes KV saves and restores and the draft model's drafting.
        limit = self.budget.limit(plan.interactive) - plan.kv_s - self.drafting_s
        plan.undrafted_s = self.budget.times.predict(plan.n_tokens)
        given = self.speculation.allocate([(c.request, d) for c, d in offers],
                                          self.budget.predict_verified, plan.n_tokens,
                                          plan.decodes, limit,
                                          between_s=self.budget.between_steps,
                                          undrafted_s=plan.undrafted_s)  # fmt: skip
        # A step never exceeds n_batch: drafts are bounded by time above, and where a full
        # batch fits the target (a GPU) the batch bounds them too.
        left = self.budget.max_batch - plan.n_tokens
        for n, (chunk, offered) in enumerate(offers):
            chunk.draft = offered[: max(0, min(given[n], left))]
            left -= len(chunk.draft)

    def draft_room(self, request: Request) -> int:
        """The most draft tokens a decoding request may feed: a step gives it one token of its
        own besides those it keeps of a draft, within max_tokens and its context."""
        return min(request.max_new_tokens - len(request.output_ids) - 1,
                   self.ctx_per_seq - request.num_computed - 2)

    def _decodes(self, decoding: list[Request], interactive: bool, now: float) -> list[Request]:
        """Step 1: every decoding sequence, unless background decodes would push a step that
        carries an interactive stream past its target; then the interactive ones, and as many
        background ones as fit, longest-waiting first, then the one with the fewest tokens (and
        any past its loose target)."""
        if not interactive or self.budget.fits(len(decoding) + self.budget.min_chunk):
            return decoding
        chosen = [r for r in decoding if is_interactive(r)]
        background = sorted((r for r in decoding if not is_interactive(r)),
                            key=lambda r: (r.scheduled_at or 0.0, len(r.output_ids)))  # fmt: skip
        loose = self.budget.background_itl_target * OVERDUE
        for request in background:
            overdue = now - (request.scheduled_at or now) >= loose
            if overdue or self.budget.fits(len(chosen) + 1 + self.budget.min_chunk):
                chosen.append(request)
        return [r for r in decoding if r in chosen]  # in admission order

    def _take_turns(self, claims: list[tuple], plan: StepPlan, room: int, now: float) -> int:
        """Step 3 for one priority: each claim in turn gets prompt room, a waiting request
        once admitted (step 4's reserve applies); returns the room left."""
        busy = {r.share for r in self.running}
        admitting = True
        for _, waiting, _, request in claims:
            if room <= 0:
                break
            if waiting:
                if not admitting or not self._may_take_a_slot(request, busy):
                    continue  # 4. the reserve: look further on for a person's first request
                if not self.cache.has_free_slot():
                    admitting = False
                    continue
                outcome = self._admit(request, plan, now)
                if outcome is Admission.FETCHING:
                    continue  # its kept prefix comes from disk; the next claim goes on
                if outcome is Admission.NO_ROOM:
                    admitting = False  # the request whose turn it is waits, not overtaken
                    continue
                self.waiting.remove(request)
                plan.admitted.append(request)
                busy.add(request.share)
                if plan.kv_s:  # what its saves and restore take comes off the step's room
                    room = min(room, self._room(plan, guard=True))
                    if room <= 0:
                        break
            room -= self._add_prompt_chunk(plan, request, room, now)
        return room

    def _room(self, plan: StepPlan, *, guard: bool, extra_s: float = 0.0) -> int:
        """The prompt tokens this step can still take (budget.tokens, less what it holds)."""
        allowed = self.budget.tokens(plan.decodes, plan.interactive, guard=guard,
                                     reserved_s=plan.kv_s + extra_s)  # fmt: skip
        return allowed - plan.n_tokens

    def _may_take_a_slot(self, request: Request, busy: set[str | None]) -> bool:
        """Step 4: the last `reserve` free slots are for a person's first request."""
        free = len(self.cache.slots) - self.cache.busy_count
        return free > self.reserve or (is_interactive(request) and request.share not in busy)

    def _add_prompt_chunk(self, plan: StepPlan, request: Request, room: int, now: float) -> int:
        # Unchunked, the budget is the whole batch, so a prompt still runs whole when it fits;
        # taking more than `room` would overflow the runner's batch (n_batch).
        take = min(request.remaining_prompt, room)
        start = request.num_computed
        if request.media:  # a run of text, then of one image, which it may not cut (vision.py)
            # An image read whole that does not fit the budget stretches one step past its
            # target: not a person's step, unless it has waited the loose background target.
            waited = now - (request.scheduled_at or request.admitted_at or now)
            may_exceed = not plan.interactive or waited >= self.budget.background_itl_target
            take = chunk_length(request.media, start, take, may_exceed=may_exceed)
            if not take:
                return 0
        tokens = request.prompt_ids[start : start + take]
        completes = start + take == request.prompt_len
        plan.chunks.append(Chunk(request, tokens, start, completes))
        plan.reads_interactive |= is_interactive(request)
        if request.prefill_started_at is None:
            request.prefill_started_at = now
        return take

    def _reservation(self, request: Request) -> int:
        return request.prompt_len + request.max_new_tokens

    def _admit(self, request: Request, plan: StepPlan, now: float) -> Admission:
        slot, reused = self.cache.choose(
            request.prompt_ids, request.cache_key, request.cache_partition
        )
        reused = reusable(request.media, reused)
        hit = self._kept_prefix(request, reused)
        if hit is not None and hit.data is None:
            # Fetched once for this request: a fetch that did not bring it is not tried again
            # (_kept_prefix then looks in RAM only), whatever kept it out.
            if self.tiers.fetch(hit.entry):
                request.fetching = request.fetched = True
                return Admission.FETCHING
            hit = None  # gone meanwhile, or larger than RAM: read the prompt

        restore_s = 0.0
        if hit is not None:
            restore_s = self.costs.restore_seconds(hit.entry.n_bytes)
            if not self._kv_fits(plan, request, restore_s, now):
                return Admission.NO_ROOM
            slot = self.cache.choose_empty()
            reused = reusable(request.media, min(hit.shared, request.prompt_len - 1))
        request.max_new_tokens = min(
            request.params.max_tokens, self.ctx_per_seq - request.prompt_len
        )
        need = self._reservation(request)
        victims = self._victims(slot, need)
        if victims is None:
            return Admission.NO_ROOM
        # What the slots give up is saved first (warm memory on): the victims' KV, and what the
        # slot holds beyond what is reused. The copies are the step's time, like a restore's.
        keep = 0 if hit is not None else reused
        saves = {save.seq_id: save for save in (
            *(self.cache.save_before_dropping(v, 0) for v in victims),
            self.cache.save_before_dropping(slot, keep),
        ) if save is not None and not self.tiers.covers(save.partition, save.tokens)}  # fmt: skip
        save_s = sum(self.costs.save_seconds(len(save.tokens)) for save in saves.values())
        if save_s and not self._kv_fits(plan, request, restore_s + save_s, now, waited=False):
            if not self._waited(request, now):
                return Admission.NO_ROOM
            # It has waited its loose target: it goes, but what the slots held is dropped
            # unsaved rather than copied past a person's ITL target.
            self.tiers.not_kept(len(saves))
            saves, save_s = {}, 0.0
        for _ in victims:
            evicted = self.cache.evict_one(keep=slot)
            plan.kv_ops.extend(op for op in evicted if not isinstance(op, KvSave)
                               or op.seq_id in saves)  # fmt: skip
        if slot.seq_id in saves:
            plan.kv_ops.append(saves[slot.seq_id])
        plan.save_s += save_s
        trim = self.cache.take(slot, keep, request.cache_key, request.cache_partition)
        if trim:
            plan.kv_ops.append(trim)
        if hit is not None:
            # The state the lookup found, not the entry's now: the disk thread may have let
            # go of it since (it was written), and the restore would then be refused.
            plan.kv_ops.append(KvRestore(slot.seq_id, request.id, hit.entry, hit.data, reused))
            plan.restore_s += restore_s
            self.tiers.touch(hit.entry)
            request.cached_tier = "disk" if request.fetched else "ram"
        elif reused:
            request.cached_tier = "resident"
        self._reserved += need
        request.seq_id = slot.seq_id
        request.cached_tokens = reused
        request.num_computed = reused
        request.admitted_at = now
        request.status = Status.PREFILLING
        self.running.append(request)
        return Admission.ADMITTED

    def _kept_prefix(self, request: Request, reused: int) -> Hit | None:
        """The tier entry to restore for `request` instead of reading its prompt, if any: the
        one sharing the longest prefix, when restoring it is cheaper than reading what it adds
        over the resident slot's `reused` tokens (tiers.costs)."""
        if self.tiers is None:
            return None
        if request.lookup_ids is None:
            request.lookup_ids = as_tokens(request.prompt_ids)
        # As for another conversation's resident slot (prefix_cache.MIN_REUSE_FRACTION): an
        # entry counts when at least half of it is the prompt's prefix, so a new conversation
        # never restores a whole entry for the chat template's first tokens.
        hit = self.tiers.lookup(request.cache_partition, request.lookup_ids, at_least=reused + 1,
                                min_fraction=MIN_REUSE_FRACTION,
                                in_ram_only=request.fetched)  # fmt: skip
        if hit is None:
            return None
        if hit.entry.pending == "read":
            return hit  # another request fetches it already: wait for it too
        gained = reusable(request.media, min(hit.shared, request.prompt_len - 1)) - reused
        per_token = self.budget.seconds_per_prompt_token()
        if gained <= 0 or not self.costs.pays(hit.entry.n_bytes, hit.data is None, gained,
                                              per_token):  # fmt: skip
            return None
        return hit

    def _victims(self, slot, need: int) -> list | None:
        """The idle slots whose KV must go for `need` more reserved cells, in the order
        PrefixCache.evict_one takes them (least recently used first), none taken yet; None
        when even all of them are not enough."""
        held = self._reserved + need + self.cache.idle_tokens - len(slot.tokens)
        candidates = sorted((s for s in self.cache.slots if not s.busy and s.tokens
                             and s is not slot), key=lambda s: s.last_used)  # fmt: skip
        victims = []
        for candidate in candidates:
            if held <= self.n_ctx:
                break
            victims.append(candidate)
            held -= len(candidate.tokens)
        return victims if held <= self.n_ctx else None

    def _kv_fits(
        self, plan: StepPlan, request: Request, seconds: float, now: float, waited: bool = True
    ) -> bool:
        """Whether KV copies (saves, a restore) of `seconds` fit this step: nobody reads a
        stream in it; or the step stays within its target; or the decodes alone overrun it
        (the starvation guard's case, budget.py 4.) and a person's copies cost no more than
        they do, as the guard's prompt share would; or (`waited`) the request has waited the
        loose background target."""
        if not plan.interactive:
            return True
        if self._room(plan, guard=False, extra_s=seconds) >= self.budget.min_chunk:
            return True
        starved = self.budget.tokens(plan.decodes, True, guard=False) <= plan.decodes
        if starved and is_interactive(request):
            if seconds <= self.budget.times.predict(plan.decodes):
                return True
        return waited and self._waited(request, now)

    def _waited(self, request: Request, now: float) -> bool:
        return now - request.accepted_at >= self.budget.background_itl_target

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
            "paused": sum(r.paused for r in self.running),
            "kv_used": self.kv_used(),
            "kv_reserved": self._reserved,
            "kv_size": self.n_ctx,
        }
