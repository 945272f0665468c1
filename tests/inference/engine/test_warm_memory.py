"""Warm memory in the engine: what sequences have read outlives their slots, their runner and
the process, and comes back only to its own partition, never as a wrong answer."""

import dataclasses
import logging
import threading
import time

import pytest

from inference.engine.budget import StepCostModel, TokenBudget
from inference.engine.engine import Engine
from inference.engine.params import SamplingParams
from inference.engine.prefix_cache import KvRestore, KvSave
from inference.engine.request import Request, Status
from inference.engine.scheduler import Scheduler
from inference.engine.tiers import KvLayout, PromptStore, RestoreCosts
from inference.engine.tiers.disk import DiskTier
from inference.engine.tiers.ledger import tree_locked

from .fakes import FakeRunner, alone_output, ask
from .tiers.runners import directory_bytes

LAYOUT = KvLayout("ef" * 32, 1, 1, 256, "f16", True, -1, FakeRunner.state_format)
SYSTEM = "The house: kitchen light, hall light, heating, front door lock. "


def warm_engine(tmp_path=None, *, ram: int = 1 << 20, slots: int = 2, **kwargs):
    """An engine on a fake runner whose prompt steps cost time (so restoring pays), with tiers."""
    disk = DiskTier(tmp_path, LAYOUT, 1 << 30) if tmp_path is not None else None
    store = PromptStore(ram, disk).open()
    fake = FakeRunner(n_slots=slots, n_ctx=slots * 256, per_token=0.0003)
    return Engine(fake, prompts=store, itl_target=1.0, **kwargs).start(), fake


def answer(engine, text, key, partition="apikey:1", max_tokens=6):
    handle = engine.submit(ask(text, SamplingParams(temperature=0, max_tokens=max_tokens),
                               cache_key=key, cache_partition=partition))  # fmt: skip
    done = list(handle.events(timeout=10))[-1]
    assert done.type == "done", done
    assert done.text == alone_output(text, max_tokens)  # the same answer, restored or not
    return done


def conversations(n: int, shared: str = SYSTEM) -> dict[str, str]:
    """n conversations; with `shared` "" none shares a prefix with another (so none reuses
    another's slot: each keeps its own until evicted)."""
    return {f"conv-{i}": f"{shared}Resident {i} asks about room {i}. " for i in range(n)}


def round_robin(engine, convs: dict[str, str], turns: int) -> list[dict]:
    figures = []
    for turn in range(turns):
        for key, text in list(convs.items()):
            done = answer(engine, text, key)
            figures.append((turn, done.figures))
            convs[key] = f"{text}{done.text} And turn {turn}? "
    return figures


def stop(engine, timeout=10):
    engine.shutdown(timeout=5)
    engine.persist_prompts(timeout)
    assert engine.runner.violations == []


def test_later_turns_of_more_conversations_than_slots_restore_from_ram():
    engine, fake = warm_engine(slots=2)
    figures = round_robin(engine, conversations(5), turns=3)
    later = [f for turn, f in figures if turn > 0]
    assert all(f["cached_by_tier"]["ram"] == f["cached_tokens"] > 0 for f in later)
    assert all(f["cached_tokens"] >= f["prompt_tokens"] - 30 for f in later)
    assert fake.restores and all(f["restore_time"] > 0 for f in later)
    use = engine.snapshot()["prompt_cache"]["use"]
    assert use["admitted"]["ram"] == len(later) and use["saved_seconds"] > 0
    stop(engine)


def test_the_cached_tokens_by_tier_add_up_to_the_cached_tokens():
    engine, _ = warm_engine(slots=1)
    for _, f in round_robin(engine, conversations(2), turns=2):
        assert sum(f["cached_by_tier"].values()) == f["cached_tokens"]
        assert set(f["cached_by_tier"]) == {"resident", "ram", "disk"}
    stop(engine)


def test_another_apps_identical_prompt_is_never_a_candidate():
    engine, fake = warm_engine(slots=1)
    text = SYSTEM + "Unlock the front door."
    answer(engine, text, "conv-a", partition="apikey:1")
    answer(engine, "Something else entirely, to take the one slot.", "x", partition="apikey:1")
    done = answer(engine, text, "conv-b", partition="apikey:2")
    assert done.figures["cached_tokens"] == 0 and fake.restores == []
    again = answer(engine, text, "conv-a", partition="apikey:1")
    assert again.figures["cached_by_tier"]["ram"] == len(text) - 1
    stop(engine)


def test_a_restart_on_the_same_directory_comes_back_from_disk(tmp_path):
    engine, _ = warm_engine(tmp_path)
    convs = conversations(3)
    first = dict(convs)
    round_robin(engine, convs, turns=1)
    stop(engine)
    engine, fake = warm_engine(tmp_path)
    for key, text in convs.items():
        done = answer(engine, text + "Next question? ", key)
        # The kept KV: the first prompt and the answer's tokens but its last (never fed back).
        assert done.figures["cached_by_tier"]["disk"] == len(first[key]) + 5
        assert done.figures["restore_time"] > 0
    stop(engine)


def test_spilled_prompts_come_back_from_disk_while_serving(tmp_path):
    engine, _ = warm_engine(tmp_path, ram=1_000, slots=1)  # room for one entry in RAM
    figures = round_robin(engine, conversations(4), turns=2)
    tiers = {tier for turn, f in figures if turn for tier, n in f["cached_by_tier"].items() if n}
    assert "disk" in tiers
    stats = engine.snapshot()["prompt_cache"]
    assert stats["ram"]["peak"] <= 1_000 and stats["fetched"] > 0
    stop(engine)


def test_two_models_swapped_while_one_flushes_keep_the_disk_within_its_bound(tmp_path):
    """Two models loaded, then one unloaded (its runner writes its RAM tier to disk) while a
    third loads and serves: the tree of kept prompts, measured all along, stays in the bound."""
    bound = 40_000

    def load(model: str) -> Engine:
        layout = dataclasses.replace(LAYOUT, model=model * 32)
        store = PromptStore(4_000, DiskTier(tmp_path, layout, bound)).open()
        fake = FakeRunner(n_slots=1, n_ctx=256, per_token=0.0001)
        return Engine(fake, prompts=store, itl_target=1.0).start()

    peak, measuring = [0], threading.Event()

    def measure():
        while not measuring.is_set():
            with tree_locked(tmp_path):  # nothing is reserved meanwhile: a sound reading
                held = sum(directory_bytes(d) for d in tmp_path.glob("*/*"))
            peak[0] = max(peak[0], held)
            time.sleep(0.01)

    monitor = threading.Thread(target=measure)
    monitor.start()
    first, second = load("ab"), load("cd")
    round_robin(first, conversations(16), turns=2)
    round_robin(second, conversations(16), turns=2)
    unloading = threading.Thread(target=stop, args=(first,))
    unloading.start()  # its flush runs while the next model loads and serves
    third = load("ef")
    round_robin(third, conversations(16), turns=2)
    unloading.join(30)
    stop(second)
    stop(third)
    measuring.set()
    monitor.join(5)
    assert 0 < peak[0] <= bound


def test_a_restore_llama_cpp_refuses_is_a_cold_read_with_the_same_answer(caplog):
    engine, fake = warm_engine(slots=1)
    convs = conversations(2)
    round_robin(engine, convs, turns=1)
    fake.refuse_restore = True
    with caplog.at_level(logging.WARNING):
        done = answer(engine, convs["conv-0"], "conv-0")
    assert done.figures["cached_tokens"] == 0
    assert "refused kept prompt" in caplog.text
    assert engine.snapshot()["prompt_cache"]["unreadable"] == 1
    stop(engine)


def test_forgetting_a_partition_drops_its_slots_and_tiers():
    engine, fake = warm_engine(slots=2)
    mine, theirs = SYSTEM + "Mine. ", SYSTEM + "Theirs. "
    answer(engine, mine, "m", partition="apikey:1")
    answer(engine, theirs, "t", partition="apikey:2")
    answer(engine, "Unrelated: evicts the first into RAM. ", "e", partition="apikey:1")
    assert engine.forget_prompts("apikey:1").result(5) >= 1
    assert answer(engine, mine, "m", partition="apikey:1").figures["cached_tokens"] == 0
    assert answer(engine, theirs, "t", partition="apikey:2").figures["cached_tokens"] > 0
    stop(engine)


def test_a_stopping_engine_keeps_what_its_idle_slots_hold(tmp_path):
    engine, fake = warm_engine(tmp_path, slots=4)
    convs = conversations(2, shared="")
    round_robin(engine, convs, turns=1)  # both still resident: nothing saved yet
    assert fake.saves == []
    engine.shutdown(timeout=5)
    assert sorted(fake.saves) == [0, 1]
    assert engine.persist_prompts(10) == 2


def test_without_tiers_the_engine_keeps_slots_only():
    fake = FakeRunner(n_slots=1, n_ctx=256, per_token=0.0003)
    engine = Engine(fake, itl_target=1.0).start()
    round_robin(engine, conversations(2), turns=2)
    assert fake.saves == [] and engine.snapshot()["prompt_cache"]["enabled"] is False
    engine.shutdown()


# --- the scheduler's side: where a restore goes, and when --------------------------------------


class SlowRestores(RestoreCosts):
    """Restores predicted to take `seconds` each."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def restore_seconds(self, n_bytes: int) -> float:
        return self.seconds

    def pays(self, *args) -> bool:
        return True


def scheduler(restore_s: float, store: PromptStore) -> Scheduler:
    budget = TokenBudget(0.1, 64, min_chunk=8, cost=StepCostModel(overhead=0.008, per_token=0.003),
                         background_itl_target=1.0)  # fmt: skip
    return Scheduler(n_ctx=1024, n_slots=4, ctx_per_seq=256, budget=budget, reserve=0,
                     tiers=store, costs=SlowRestores(restore_s))  # fmt: skip


def request(rid, ids, now, priority="interactive", max_tokens=50) -> Request:
    return Request(rid, list(ids), SamplingParams(max_tokens=max_tokens), now,
                   cache_partition="p", priority=priority)  # fmt: skip


def decoding_stream(sched: Scheduler, now: float) -> Request:
    stream = request("stream", range(500, 520), now)
    sched.add(stream)
    sched.schedule(now)
    stream.num_computed, stream.status = stream.prompt_len, Status.DECODING
    stream.output_ids.append(7)
    return stream


def test_a_restore_goes_into_an_empty_slot_after_the_save_of_what_it_held():
    store = PromptStore(1 << 20)
    store.put("p", "old", list(range(100)), bytearray(b"s" * 400))
    sched = scheduler(0.0001, store)
    sched.cache.slots[0].tokens, sched.cache.slots[0].partition = list(range(900, 960)), "p"
    for slot in sched.cache.slots[1:]:
        slot.tokens, slot.partition = list(range(2000, 2060)), "q"
    new = request("new", list(range(100)) + [5, 6, 7], 0.0)
    sched.add(new)
    plan = sched.schedule(1.0)
    assert plan.admitted == [new] and new.cached_tier == "ram" and new.cached_tokens == 100
    restore = next(op for op in plan.kv_ops if isinstance(op, KvRestore))
    before = plan.kv_ops[: plan.kv_ops.index(restore)]
    assert any(isinstance(op, KvSave) and op.seq_id == restore.seq_id for op in before)
    assert plan.chunks[0].start == 100 and restore.keep == 100


def test_a_restore_that_overruns_the_itl_target_waits_beside_a_persons_stream():
    store = PromptStore(1 << 20)
    store.put("p", "kept", list(range(100)), bytearray(b"s" * 400))
    sched = scheduler(0.5, store)  # a restore predicted at 0.5 s; the target is 0.1 s
    decoding_stream(sched, 0.0)
    waiting = request("kept", list(range(100)) + [1, 2], 0.0)
    sched.add(waiting)
    plan = sched.schedule(0.1)
    assert waiting not in plan.admitted and plan.restores == []
    assert [c.request.id for c in plan.chunks] == ["stream"]
    # ... until it has waited the loose background target.
    plan = sched.schedule(1.2)
    assert waiting in plan.admitted and len(plan.restores) == 1


def test_a_restore_that_fits_shares_the_step_and_shrinks_its_prompt_room():
    store = PromptStore(1 << 20)
    store.put("p", "kept", list(range(100)), bytearray(b"s" * 400))
    sched = scheduler(0.03, store)
    decoding_stream(sched, 0.0)
    waiting = request("kept", list(range(100)) + list(range(3000, 3060)), 0.0)
    sched.add(waiting)
    plan = sched.schedule(0.1)
    assert waiting in plan.admitted and plan.restore_s == pytest.approx(0.03)
    prompt = sum(len(c.tokens) for c in plan.chunks if c.request is waiting)
    # 0.08 s a step less 0.03 s of restore: (0.05 - 0.008) / 0.003 = 14 tokens, 1 a decode.
    assert prompt == 13


def test_a_request_whose_prefix_is_on_disk_waits_without_holding_up_others(tmp_path):
    disk = DiskTier(tmp_path, LAYOUT, 1 << 30)
    store = PromptStore(1 << 20, disk).open()
    kept = store.put("p", "kept", list(range(100)), bytearray(b"s" * 400))
    store.flush(5)
    assert kept.on_disk and not kept.in_ram
    sched = scheduler(0.0001, store)
    first = request("first", list(range(100)) + [1], 0.0)
    other = request("other", range(7000, 7010), 0.0)
    sched.add(first)
    sched.add(other)
    plan = sched.schedule(0.1)
    assert plan.admitted == [other] and first.fetching and not sched.admissible
    assert disk.drain(5) and kept.in_ram
    sched.fetched()
    plan = sched.schedule(0.2)
    assert plan.admitted == [first] and first.cached_tier == "disk"
    store.close()


def test_background_prompts_beside_a_persons_stream_get_no_starvation_share():
    budget = TokenBudget(0.1, 64, min_chunk=8, cost=StepCostModel(overhead=0.09, per_token=0.003),
                         background_itl_target=1.0)  # fmt: skip
    sched = Scheduler(n_ctx=1024, n_slots=4, ctx_per_seq=256, budget=budget, reserve=0)
    decoding_stream(sched, 0.0)  # a step of 1 token predicted at 0.093 s: past 0.08
    app = request("app", range(4000, 4100), 0.0, priority="background")
    person = request("person", range(5000, 5100), 0.0)
    sched.add(app)
    plan = sched.schedule(time.monotonic())
    assert app not in plan.admitted  # it may wait: the guard is not for it
    sched.add(person)
    plan = sched.schedule(time.monotonic())
    assert person in plan.admitted and sum(len(c.tokens) for c in plan.chunks) > 9
