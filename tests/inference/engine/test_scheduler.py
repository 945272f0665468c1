"""The scheduler, driven directly: requests in, plans out, runner results fed back by hand.

`Driver.update` does what the engine does with a step's results, and the fake runner holds the
KV, so a wrong position, a missing trim or an over-full context shows up as a violation.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.engine.budget import StepCostModel, TokenBudget
from inference.engine.params import SamplingParams
from inference.engine.prefix_cache import KvTrim
from inference.engine.request import Request, Status
from inference.engine.scheduler import QueueFull, Scheduler, StepPlan

from .fakes import FakeRunner, next_token

MAX_BATCH = 64
# itl 0.1 s * safety 0.8 = 0.08 s a step; (0.08 - 0.008) / 0.003 = 24 tokens while decoding.
DECODE_BUDGET = 24


def prompt(n: int, tag: int) -> list[int]:
    """n prompt tokens that share no prefix with another tag's."""
    return [tag * 1000 + i for i in range(n)]


def reference_output(prompt_ids: list[int], n: int) -> list[int]:
    kv = list(prompt_ids)
    out = []
    for _ in range(n):
        out.append(next_token(kv))
        kv.append(out[-1])
    return out


class Driver:
    def __init__(
        self,
        *,
        n_ctx: int = 1024,
        n_slots: int = 4,
        ctx_per_seq: int = 256,
        max_batch: int = MAX_BATCH,
        chunked: bool = True,
        max_queue: int = 64,
        prefix_cache: bool = True,
        min_chunk: int = 8,
        reserve: int | None = 0,
        background_itl_target: float = 1.0,
    ):
        self.fake = FakeRunner(
            n_ctx=n_ctx, n_slots=n_slots, ctx_per_seq=ctx_per_seq, n_batch=max_batch
        )
        cost = StepCostModel(overhead=0.008, per_token=0.003)
        self.budget = TokenBudget(0.1, max_batch, min_chunk=min_chunk, chunked=chunked, cost=cost,
                                  background_itl_target=background_itl_target)  # fmt: skip
        self.sched = Scheduler(
            n_ctx=n_ctx, n_slots=n_slots, ctx_per_seq=ctx_per_seq, budget=self.budget,
            max_queue=max_queue, prefix_cache=prefix_cache, reserve=reserve,
        )  # fmt: skip
        self.now = 0.0
        self.plans: list[StepPlan] = []
        self.finished: list[Request] = []

    def submit(self, rid: str, ids: list[int], max_tokens: int = 4, cache_key=None,
               priority: str = "interactive", share: str | None = None) -> Request:  # fmt: skip
        request = Request(
            rid,
            list(ids),
            SamplingParams(max_tokens=max_tokens),
            self.now,
            cache_key=cache_key,
            priority=priority,
            share=share,
        )
        self.sched.add(request)
        return request

    def step(self) -> StepPlan:
        self.now += 1.0
        plan = self.sched.schedule(self.now)
        self.fake.trim(plan.kv_trims)
        sampled = self.fake.execute(plan.chunks) if plan.chunks else []
        assert len(sampled) == sum(c.sample for c in plan.chunks)
        self.update(plan, [tokens[0] for tokens in sampled])
        self.plans.append(plan)
        return plan

    def update(self, plan: StepPlan, sampled: list[int]) -> None:
        """What the engine does with a step's results."""
        tokens = iter(sampled)
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed += len(chunk.tokens)
            if chunk.sample:
                request.status = Status.DECODING
                request.output_ids.append(next(tokens))
                if len(request.output_ids) >= request.max_new_tokens:
                    self.sched.finish(request, keep_kv=True)
                    request.status = Status.FINISHED
                    request.finished_at = self.now
                    self.finished.append(request)

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError(f"still working after {max_steps} steps")

    def cancel(self, rid: str) -> Request | None:
        request = self.sched.cancel(rid)
        if request is not None:
            request.status = Status.CANCELLED
        return request

    def assert_idle_and_empty(self) -> None:
        counts = self.sched.counts()
        assert counts["waiting"] == counts["prefilling"] == counts["decoding"] == 0
        assert counts["kv_reserved"] == 0
        assert self.sched.cache.busy_count == 0


def chunks_for(plan: StepPlan, request: Request):
    return [c for c in plan.chunks if c.request is request]


# --- the contract ----------------------------------------------------------------------------


def test_every_decoding_sequence_gets_exactly_one_token_in_every_plan():
    d = Driver()
    requests = [d.submit(f"r{i}", prompt(10 + 30 * i, i + 1), max_tokens=12) for i in range(4)]
    late = []
    while d.sched.has_work:
        if len(d.plans) == 5:  # a long prompt arrives while the others decode
            late.append(d.submit("late", prompt(150, 9), max_tokens=3))
        decoding = [r for r in d.sched.running if r.status == Status.DECODING]
        plan = d.step()
        for request in decoding:
            (chunk,) = chunks_for(plan, request)
            assert chunk.tokens == [request.output_ids[-2]]  # the last sampled token, fed back
            assert chunk.sample
    assert {r.id for r in d.finished} == {r.id for r in requests + late}
    assert d.fake.violations == []


def test_the_token_budget_is_never_exceeded_except_for_the_floor():
    d = Driver(max_batch=48)
    for i in range(4):
        d.submit(f"r{i}", prompt(90, i + 1), max_tokens=20)
    while d.sched.has_work:
        decoding = sum(r.status == Status.DECODING for r in d.sched.running)
        allowed = max(d.budget.tokens(decoding), decoding + d.budget.min_chunk)
        plan = d.step()
        assert plan.n_tokens <= allowed
        assert plan.n_tokens <= 48
        if decoding:
            assert plan.n_tokens <= max(DECODE_BUDGET, decoding + 8)


def test_the_decode_floor_never_exceeds_the_batch_the_runner_can_take():
    # 8 decoding sequences + a min_chunk of 8 would be 16 tokens, more than n_batch.
    d = Driver(n_slots=8, max_batch=12, n_ctx=2048)
    for i in range(8):
        d.submit(f"r{i}", prompt(4, i + 1), max_tokens=30)
    d.submit("long", prompt(60, 20), max_tokens=2)
    d.run()
    assert all(p.n_tokens <= 12 for p in d.plans)
    assert d.fake.violations == []
    assert len(d.finished) == 9


def test_with_nobody_decoding_the_budget_is_the_full_batch():
    d = Driver()
    long = d.submit("long", prompt(200, 1), max_tokens=2)
    plan = d.step()
    assert [len(c.tokens) for c in plan.chunks] == [MAX_BATCH]
    assert d.budget.tokens(0) == MAX_BATCH
    assert long.status == Status.PREFILLING


def test_a_prompt_larger_than_the_budget_is_split_into_consecutive_chunks_covering_it_once():
    d = Driver()
    d.submit("a", prompt(5, 1), max_tokens=40)
    d.step()  # a is decoding from now on
    long = d.submit("long", prompt(170, 2), max_tokens=2)
    d.run()
    prefill = [c for p in d.plans for c in chunks_for(p, long) if c.start < long.prompt_len]
    assert len(prefill) > 1  # spread over several steps
    position = 0
    covered = []
    for chunk in prefill:
        assert chunk.start == position
        assert 0 < len(chunk.tokens) <= DECODE_BUDGET - 1
        covered += chunk.tokens
        position += len(chunk.tokens)
    assert covered == long.prompt_ids


def test_only_the_chunk_that_completes_a_prompt_samples():
    d = Driver()
    d.submit("a", prompt(5, 1), max_tokens=30)
    d.step()
    long = d.submit("long", prompt(100, 2), max_tokens=1)
    d.run()
    prefill = [c for p in d.plans for c in chunks_for(p, long)]
    assert [c.sample for c in prefill] == [False] * (len(prefill) - 1) + [True]
    assert prefill[-1].start + len(prefill[-1].tokens) == long.prompt_len


def test_chunked_off_runs_a_whole_prompt_in_one_step():
    d = Driver(chunked=False)
    d.submit("a", prompt(5, 1), max_tokens=30)
    d.step()
    long = d.submit("long", prompt(60, 2), max_tokens=2)
    plan = d.step()
    (chunk,) = chunks_for(plan, long)
    assert chunk.tokens == long.prompt_ids
    assert chunk.sample


def test_chunked_off_still_never_exceeds_the_batch_with_decoders_present():
    d = Driver(chunked=False)
    d.submit("a", prompt(5, 1), max_tokens=30)
    d.submit("b", prompt(5, 2), max_tokens=30)
    d.step()
    d.submit("long", prompt(MAX_BATCH, 3), max_tokens=2)
    d.submit("long2", prompt(40, 4), max_tokens=2)
    d.run()
    assert all(p.n_tokens <= MAX_BATCH for p in d.plans)
    assert d.fake.violations == []
    assert len(d.finished) == 4


# --- fairness --------------------------------------------------------------------------------


def test_admission_is_first_in_first_out():
    d = Driver(n_slots=1)
    requests = [d.submit(f"r{i}", prompt(3, i + 1), max_tokens=2) for i in range(5)]
    d.run()
    assert [r.id for r in d.finished] == [r.id for r in requests]
    admitted = [r.admitted_at for r in requests]
    assert admitted == sorted(admitted)


def test_a_long_prompt_and_many_short_ones_all_finish():
    d = Driver(n_slots=3, ctx_per_seq=512, n_ctx=1536)
    long = d.submit("long", prompt(400, 1), max_tokens=5)
    shorts = []
    for step in range(60):
        if step % 3 == 0:
            shorts.append(d.submit(f"s{step}", prompt(6, step + 10), max_tokens=6))
        d.step()
    d.run()
    assert long in d.finished
    assert all(s in d.finished for s in shorts)
    # The long prompt kept advancing while short ones came and went.
    prefill_steps = [i for i, p in enumerate(d.plans) if chunks_for(p, long)]
    assert prefill_steps[-1] < 60


# --- fair share and priorities --------------------------------------------------------------


def flood(d: Driver, n: int, *, tokens: int = 20, max_tokens: int = 6, priority="interactive",
          share="apikey:3", tag: int = 100) -> list[Request]:  # fmt: skip
    return [d.submit(f"app{i}", prompt(tokens, tag + i), max_tokens=max_tokens,
                     priority=priority, share=share) for i in range(n)]  # fmt: skip


def test_a_persons_first_request_is_admitted_next_while_another_share_has_30_waiting():
    d = Driver(n_slots=2, n_ctx=2048)
    backlog = flood(d, 32)
    d.step()
    assert d.sched.counts()["waiting"] == 30
    person = d.submit("person", prompt(10, 1), share="user:5")
    arrived = len(d.plans)
    d.run()
    first_admission = next(p for p in d.plans[arrived:] if p.admitted)
    assert first_admission.admitted[0] is person
    assert person.output_ids == reference_output(person.prompt_ids, 4)
    assert all(r in d.finished for r in backlog)


def test_a_reserved_slot_lets_a_persons_first_request_start_at_once_beside_a_flood():
    d = Driver(n_slots=4, reserve=1)
    backlog = flood(d, 12, max_tokens=30, priority="background")
    for _ in range(3):
        d.step()
    assert d.sched.cache.busy_count == 3  # the flood never takes the last slot
    person = d.submit("person", prompt(10, 1), share="user:5")
    plan = d.step()
    assert plan.admitted == [person]
    d.run()
    # Whatever ran beside it, every answer is what it would be alone.
    for request in (person, *backlog):
        assert request.output_ids == reference_output(request.prompt_ids, request.max_new_tokens)
    assert d.fake.violations == []


def test_an_interactive_flood_leaves_the_reserve_to_a_share_with_nothing_running():
    d = Driver(n_slots=4, reserve=1)
    flood(d, 8, max_tokens=30)  # the app's key is interactive (the default)
    d.step()
    assert d.sched.cache.busy_count == 3
    person = d.submit("person", prompt(10, 1), share="user:5")
    second = d.submit("person2", prompt(10, 2), share="user:5")  # the same person, again
    assert d.step().admitted == [person]
    assert second.status == Status.WAITING  # a share already running does not get the reserve


def test_the_reserve_is_one_slot_from_four_slots_up_and_never_every_slot():
    def reserve(n_slots, asked=None):
        budget = TokenBudget(0.1, 64)
        return Scheduler(n_ctx=1024, n_slots=n_slots, ctx_per_seq=128, budget=budget,
                         reserve=asked).reserve  # fmt: skip

    assert [reserve(n) for n in (1, 2, 3, 4, 8, 16)] == [0, 0, 0, 1, 1, 1]
    assert reserve(4, asked=9) == 3


def test_interactive_requests_are_admitted_before_any_waiting_background_request():
    d = Driver(n_slots=1)
    d.submit("running", prompt(5, 1), max_tokens=3, priority="background", share="app")
    d.step()
    background = [d.submit(f"b{i}", prompt(5, 2 + i), priority="background", share="app")
                  for i in range(2)]  # fmt: skip
    person = d.submit("person", prompt(5, 9), share="app")  # even from the same share
    d.run()
    assert person.admitted_at < min(b.admitted_at for b in background)
    assert background[0].admitted_at < background[1].admitted_at


def test_a_background_prompt_pauses_while_a_persons_prompt_is_read_and_resumes_where_it_was():
    d = Driver()
    batch = d.submit("batch", prompt(200, 1), max_tokens=5, priority="background", share="app")
    d.step()
    read = batch.num_computed
    person = d.submit("person", prompt(100, 2), max_tokens=5, share="user:5")
    while person.status == Status.WAITING or person.num_computed < person.prompt_len:
        plan = d.step()
        assert chunks_for(plan, batch) == [] and plan.paused == [batch]
        assert batch.paused and batch.num_computed == read
    plan = d.step()  # the person's stream decodes: the batch's prompt goes on beside it
    (chunk,) = chunks_for(plan, batch)
    assert chunk.start == read and not batch.paused
    d.run()
    assert batch.output_ids == reference_output(batch.prompt_ids, 5)
    assert person.output_ids == reference_output(person.prompt_ids, 5)
    assert d.fake.violations == []


def test_background_decodes_ride_beside_a_persons_stream_only_as_far_as_its_target_allows():
    # Decodes are dear here: 0.02 s + 0.01 s a token, so 6 tokens fill the 0.08 s a step may
    # take beside a person's stream; a background stream waits at most 2.8 s (3 steps).
    d = Driver(n_slots=8, n_ctx=2048, min_chunk=1, background_itl_target=3.5)
    d.budget.cost = StepCostModel(overhead=0.02, per_token=0.01)
    batch = flood(d, 7, tokens=5, max_tokens=40, priority="background")
    for _ in range(2):
        assert not d.step().paused  # background streams alone: every one decodes
    person = d.submit("person", prompt(5, 1), max_tokens=20, share="user:5")
    last_token = {r.id: len(d.plans) for r in batch}
    paused_steps = 0
    while person not in d.finished:
        plan = d.step()
        if person.status != Status.DECODING or person.num_computed <= person.prompt_len:
            continue
        assert chunks_for(plan, person)  # the person's stream never waits
        assert plan.decodes <= 6 or any(
            len(d.plans) - last_token[r.id] >= 3 for r in batch if chunks_for(plan, r)
        )
        for request in batch:
            if chunks_for(plan, request):
                assert len(d.plans) - last_token[request.id] <= 3  # never frozen
                last_token[request.id] = len(d.plans)
        paused_steps += bool(plan.paused)
    assert paused_steps > 0
    d.run()
    for request in (person, *batch):
        assert request.output_ids == reference_output(request.prompt_ids, request.max_new_tokens)
    assert d.fake.violations == []


def prompt_chunks_beside_a_stream(priority: str, cost=None, **driver) -> list[int]:
    d = Driver(**driver)
    if cost is not None:
        d.budget.cost = cost
    d.submit("stream", prompt(5, 1), max_tokens=60, priority=priority)
    d.step()
    long = d.submit("long", prompt(170, 2), max_tokens=2, priority=priority)
    d.run()
    return [len(c.tokens) for p in d.plans for c in chunks_for(p, long)][:-1]  # not the decode


def test_steps_whose_streams_are_all_background_use_the_full_batch():
    assert set(prompt_chunks_beside_a_stream("background")[:-1]) == {MAX_BATCH - 1}
    # The same work with a person reading the stream: the ITL target binds every step.
    assert set(prompt_chunks_beside_a_stream("interactive")[:-1]) == {DECODE_BUDGET - 1}


def test_background_steps_keep_to_their_own_loose_target():
    # 0.01 s + 0.01 s a token: a full batch would take 0.65 s, more than the 0.5 s a background
    # stream may wait (0.4 s with the safety margin), in which 39 tokens fit.
    slow = StepCostModel(overhead=0.01, per_token=0.01)
    chunks = prompt_chunks_beside_a_stream("background", slow, background_itl_target=0.5)
    assert set(chunks[:-1]) == {39 - 1}
    # Beside a person's stream the ITL target holds the prompt to the floor: min_chunk 8.
    chunks = prompt_chunks_beside_a_stream("interactive", slow, background_itl_target=0.5)
    assert set(chunks[:-1]) == {8}


def test_background_prompts_with_nobody_decoding_are_read_in_steps_at_the_knee():
    # A curve that flattens past 32 tokens (per token 2.5 ms there, 2.3 at 128): the knee is
    # 64 tokens' 0.15 s, so a document read with nobody decoding goes in steps of that size, not
    # the whole batch, and a person who comes meanwhile waits one such step at most.
    d = Driver(min_chunk=1, max_batch=256)
    for _ in range(3):
        for tokens, seconds in {1: 0.010, 4: 0.020, 16: 0.050, 32: 0.080, 64: 0.150,
                                128: 0.290}.items():  # fmt: skip
            d.budget.observe(tokens, seconds)
    document = d.submit("doc", prompt(200, 1), max_tokens=2, priority="background")
    plan = d.step()
    assert 32 <= len(chunks_for(plan, document)[0].tokens) < 64
    assert plan.target_s == pytest.approx(d.budget.knee_seconds())
    # A person's prompt with nobody decoding is read whole: no target binds that step.
    person = d.submit("person", prompt(100, 2), max_tokens=2, share="user:1")
    plan = d.step()
    assert [len(c.tokens) for c in chunks_for(plan, person)] == [100]
    assert plan.target_s == 0.0


def test_every_plan_says_its_target_and_the_time_the_curve_predicts_for_it():
    d = Driver()
    d.submit("stream", prompt(5, 1), max_tokens=30)
    d.step()
    d.submit("long", prompt(170, 2), max_tokens=2)
    plan = d.step()
    assert plan.target_s == 0.1  # an interactive stream decodes in it: the ITL target binds
    assert plan.predicted_s == pytest.approx(d.budget.times.predict(plan.n_tokens))
    assert plan.predicted_s <= d.budget.limit(True)


# --- cancellation ----------------------------------------------------------------------------


def test_cancelling_a_waiting_request_removes_it_from_the_queue():
    d = Driver(n_slots=1)
    d.submit("a", prompt(5, 1), max_tokens=10)
    d.step()
    b = d.submit("b", prompt(5, 2), max_tokens=10)
    assert d.cancel("b") is b
    assert d.sched.counts()["waiting"] == 0
    d.run()
    assert b.seq_id is None
    assert [r.id for r in d.finished] == ["a"]


def test_cancelling_a_prefilling_request_frees_its_slot_and_kv():
    d = Driver(prefix_cache=True)
    long = d.submit("long", prompt(200, 1), max_tokens=5)
    d.step()
    assert long.status == Status.PREFILLING and d.fake.kv[long.seq_id]
    assert d.cancel("long") is long
    d.assert_idle_and_empty()
    d.step()  # the pending trim is applied with the next plan
    assert KvTrim(long.seq_id, 0) in d.fake.trims
    assert d.fake.kv_used() == 0
    assert d.sched.kv_used() == 0
    assert not d.sched.has_work


def test_cancelling_a_decoding_request_frees_its_slot_and_kv():
    d = Driver()
    a = d.submit("a", prompt(10, 1), max_tokens=50)
    b = d.submit("b", prompt(10, 2), max_tokens=5)
    for _ in range(3):
        d.step()
    assert a.status == Status.DECODING
    d.cancel("a")
    plan = d.step()
    assert KvTrim(a.seq_id, 0) in plan.kv_trims
    assert all(c.request is not a for c in plan.chunks)
    d.run()
    assert d.fake.kv[a.seq_id] == []
    assert b in d.finished
    d.assert_idle_and_empty()
    # b's finished turn stays cached; nothing of a's does.
    assert d.sched.kv_used() == len(d.fake.kv[b.seq_id]) == d.fake.kv_used()


def test_cancelling_an_unknown_request_returns_none():
    assert Driver().sched.cancel("nobody") is None


# --- queue and KV room -----------------------------------------------------------------------


def test_the_bounded_queue_raises_queue_full():
    d = Driver(max_queue=2)
    d.submit("a", prompt(3, 1))
    d.submit("b", prompt(3, 2))
    with pytest.raises(QueueFull):
        d.submit("c", prompt(3, 3))


def test_max_new_tokens_is_clamped_to_what_the_sequence_can_hold():
    d = Driver(ctx_per_seq=32)
    r = d.submit("r", prompt(28, 1), max_tokens=100)
    d.run()
    assert r.max_new_tokens == 4
    assert len(r.output_ids) == 4


def test_admission_waits_while_the_kv_reservation_would_not_fit_and_proceeds_when_room_frees():
    d = Driver(n_ctx=100, ctx_per_seq=100)
    a = d.submit("a", prompt(10, 1), max_tokens=60)  # reserves 70 of 100
    b = d.submit("b", prompt(10, 2), max_tokens=60)  # another 70: must wait for a
    c = d.submit("c", prompt(5, 3), max_tokens=5)  # would fit, but may not overtake b
    d.step()
    assert a.status == Status.DECODING
    assert b.status == c.status == Status.WAITING
    d.run()
    assert b.admitted_at > a.finished_at
    assert c.admitted_at >= b.admitted_at
    assert {r.id for r in d.finished} == {"a", "b", "c"}
    assert d.fake.violations == []


# --- prefix cache ----------------------------------------------------------------------------


def test_a_prompt_extending_a_finished_turn_reuses_its_kv():
    d = Driver()
    first = d.submit("t1", prompt(20, 1), max_tokens=6, cache_key="conv")
    d.run()
    held = first.prompt_ids + first.output_ids[:-1]  # the last sampled token was never fed
    assert d.fake.kv[first.seq_id] == held
    second = d.submit("t2", first.prompt_ids + first.output_ids + prompt(5, 2), cache_key="conv")
    plan = d.step()
    assert second.seq_id == first.seq_id
    assert second.cached_tokens == len(held)
    assert not plan.kv_trims  # everything the slot holds is reused
    (chunk,) = chunks_for(plan, second)
    assert chunk.start == len(held)
    d.run()
    assert second.output_ids == reference_output(second.prompt_ids, 4)


def test_a_prompt_sharing_part_of_a_finished_turn_trims_the_slots_tail():
    d = Driver()
    first = d.submit("t1", prompt(20, 1), max_tokens=6)
    d.run()
    edited = first.prompt_ids + first.output_ids[:2] + prompt(7, 2)
    second = d.submit("t2", edited)
    plan = d.step()
    assert second.seq_id == first.seq_id
    assert second.cached_tokens == 22
    assert plan.kv_trims == [KvTrim(first.seq_id, 22)]
    d.run()
    assert second.output_ids == reference_output(edited, 4)
    assert d.fake.violations == []


def test_an_identical_prompt_still_computes_its_last_token():
    d = Driver()
    first = d.submit("t1", prompt(20, 1), max_tokens=1)
    d.run()  # the slot holds the 20 prompt tokens
    second = d.submit("t2", prompt(20, 1), max_tokens=1)
    plan = d.step()
    assert second.cached_tokens == 19
    assert plan.kv_trims == [KvTrim(first.seq_id, 19)]
    (chunk,) = chunks_for(plan, second)
    assert chunk.tokens == [second.prompt_ids[-1]] and chunk.sample


def test_with_the_prefix_cache_off_a_finished_turn_frees_its_kv():
    d = Driver(prefix_cache=False)
    first = d.submit("t1", prompt(20, 1), max_tokens=3)
    d.run()
    assert d.fake.kv_used() == 0
    assert KvTrim(first.seq_id, 0) in d.fake.trims
    second = d.submit("t2", first.prompt_ids + first.output_ids)
    d.run()
    assert second.cached_tokens == 0


def test_cached_turns_are_evicted_least_recently_used_under_kv_pressure():
    d = Driver(n_ctx=100, ctx_per_seq=100)
    older = d.submit("older", prompt(20, 1), max_tokens=10)
    d.run()
    newer = d.submit("newer", prompt(20, 2), max_tokens=10)
    d.run()
    assert d.sched.cache.idle_tokens == 58  # two cached turns of 29 tokens
    big = d.submit("big", prompt(10, 3), max_tokens=40)  # reserves 50: 50 + 58 > 100
    plan = d.step()
    assert KvTrim(older.seq_id, 0) in plan.kv_trims
    assert all(t.seq_id != newer.seq_id for t in plan.kv_trims)
    assert big.seq_id not in (older.seq_id, newer.seq_id)
    d.run()
    assert d.fake.kv[older.seq_id] == []
    # The newer turn survived: its conversation's next turn still hits the cache.
    follow = d.submit("follow", newer.prompt_ids + newer.output_ids + prompt(3, 4))
    d.run()
    assert follow.cached_tokens == 29
    assert d.fake.violations == []


# --- a property over random workloads --------------------------------------------------------


workload = st.lists(
    st.tuples(
        st.integers(1, 120),  # prompt length
        st.integers(1, 30),  # max_tokens
        st.integers(0, 40),  # arrival step
        st.one_of(st.none(), st.integers(0, 60)),  # cancel at step
        st.integers(0, 2),  # which of three shared prefixes the prompt starts with
        st.sampled_from(["interactive", "background"]),
        st.sampled_from([None, "apikey:1", "user:2"]),  # whose turn it takes
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    workload=workload,
    n_slots=st.integers(1, 5),
    max_batch=st.integers(16, 96),
    n_ctx=st.integers(128, 600),
    chunked=st.booleans(),
    reserve=st.integers(0, 2),
)
def test_any_workload_keeps_the_contract_and_every_answer_is_what_it_would_be_alone(
    workload, n_slots, max_batch, n_ctx, chunked, reserve
):
    ctx_per_seq = min(128, n_ctx)
    d = Driver(
        n_ctx=n_ctx, n_slots=n_slots, ctx_per_seq=ctx_per_seq, max_batch=max_batch,
        chunked=chunked, reserve=reserve,
    )  # fmt: skip
    arrivals: dict[int, list] = {}
    for i, (length, max_tokens, at, cancel_at, family, priority, share) in enumerate(workload):
        length = min(length, ctx_per_seq - 1)
        # Prompts of one family share a prefix, so the prefix cache has something to reuse.
        ids = prompt(min(length, 10), family + 1)[:length] + prompt(length, 50 + i)[10:]
        arrivals.setdefault(at, []).append(
            (f"r{i}", ids, max_tokens, cancel_at, dict(priority=priority, share=share))
        )
    requests: dict[str, Request] = {}
    cancels: dict[int, list[str]] = {}
    step = 0
    while step <= 40 or d.sched.has_work:
        assert step < 5000
        for rid, ids, max_tokens, cancel_at, who in arrivals.get(step, []):
            requests[rid] = d.submit(rid, ids, max_tokens, **who)
            if cancel_at is not None:
                cancels.setdefault(step + cancel_at, []).append(rid)
        for rid in cancels.get(step, []):
            d.cancel(rid)
        step += 1
        decoding = [r for r in d.sched.running if r.status == Status.DECODING]
        prefilling = {r.id: r.num_computed for r in d.sched.running}
        plan = d.step()
        assert plan.n_tokens <= max_batch
        for request in decoding:
            if request in plan.paused:  # only background streams, beside a person's
                assert request.priority == "background" and plan.interactive
                continue
            (chunk,) = chunks_for(plan, request)
            assert len(chunk.tokens) == 1 and chunk.sample
        if plan.reads_interactive:  # a person's prompt is read: background prompts wait
            assert all(c.request.priority == "interactive" for c in plan.chunks[plan.decodes :])
        for chunk in plan.chunks:
            request = chunk.request
            if request in decoding:
                continue
            assert chunk.start == prefilling.get(request.id, request.cached_tokens)
            assert chunk.sample == (chunk.start + len(chunk.tokens) == request.prompt_len)
        counts = d.sched.counts()
        assert counts["kv_used"] <= n_ctx
        assert counts["kv_reserved"] + d.sched.cache.idle_tokens <= n_ctx
    assert d.fake.violations == []
    d.assert_idle_and_empty()
    for request in requests.values():
        assert request.status in (Status.FINISHED, Status.CANCELLED)
        if request.status == Status.FINISHED:
            assert request.output_ids == reference_output(
                request.prompt_ids, request.max_new_tokens
            )


def test_a_prompt_beside_a_stream_on_a_box_too_slow_for_the_target_is_still_read_in_chunks():
    d = Driver(ctx_per_seq=1024, n_ctx=4096, max_batch=512, min_chunk=1)
    # A decode step alone takes 0.7 s against the 0.1 s target: nothing can meet it.
    d.budget.cost = StepCostModel(overhead=0.5, per_token=0.2)
    stream = d.submit("stream", prompt(4, 1), max_tokens=500)
    while stream.status != Status.DECODING:
        d.step()
    long = d.submit("long", prompt(600, 2), max_tokens=1)
    steps = 0
    while long not in d.finished:
        d.step()
        steps += 1
        assert stream.status == Status.DECODING  # the stream writes on beside it
    # Held to the one-token floor it would take 600 steps; it shares the steps instead.
    assert steps <= 600 // 32 + 2


def test_drafts_never_push_a_step_past_the_batch_even_where_a_full_batch_fits_the_target():
    # A GPU-like box: any step fits the target, so only the batch bounds the drafts.
    from inference.engine.speculation.policy import Speculation

    d = Driver(min_chunk=1, max_batch=64)
    d.budget.cost = StepCostModel(overhead=0.001, per_token=0.00001)
    d.sched.speculation = Speculation("always")
    text = [5, 6, 7, 8] * 10  # a prompt that repeats itself: every stream has a draft of 4
    streams = [d.submit(f"s{n}", text, max_tokens=40, cache_key=f"c{n}") for n in range(3)]
    for request in streams:
        d.sched.speculation.start(request)
    while not all(r.status == Status.DECODING for r in streams):
        d.step()
    d.submit("long", prompt(58, 9), max_tokens=2)  # 3 decodes + 58: room for 3 drafted tokens
    plan = d.sched.schedule(d.now + 1)
    assert plan.draft_tokens == 3 and plan.n_tokens == 64
