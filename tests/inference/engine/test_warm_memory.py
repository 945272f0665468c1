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


# --- defects found in review (issue 30) ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_kept_prompt_larger_than_the_ram_bound_is_read_again_not_waited_for(tmp_path):
    engine, _ = warm_engine(tmp_path)
    text = conversations(1)["conv-0"]
    answer(engine, text, "conv-0")
    stop(engine)  # kept on disk (some 300 bytes)
    probe = PromptStore(1 << 20, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    [kept] = probe.held()
    kept_bytes = kept.n_bytes
    probe.close()
    # Restarted with less RAM: the entry on disk is larger than the whole RAM tier.
    engine, fake = warm_engine(tmp_path, ram=kept_bytes - 1)
    done = answer(engine, text + "Next? ", "conv-0")
    assert done.figures["cached_tokens"] == 0 and fake.restores == []
    stats = engine.snapshot()["prompt_cache"]
    assert stats["fetched"] == 0 and stats["ram"]["peak"] <= kept_bytes - 1
    stop(engine)


class DiskDoneMidPlan(RestoreCosts):
    """Lets the disk thread deliver a finished write while the scheduler plans a restore:
    between its lookup of the entry and the restore it builds."""

    def __init__(self, gate, disk):
        super().__init__()
        self.gate, self.disk = gate, disk

    def restore_seconds(self, n_bytes: int) -> float:
        self.gate.set()
        assert self.disk.drain(5)
        return 0.0001

    def pays(self, *args) -> bool:
        return True


def test_a_restore_keeps_the_state_it_looked_up_when_the_disk_thread_drops_it(tmp_path):
    import threading

    store = PromptStore(1_000, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    gate = threading.Event()
    deliver = store.disk.notify
    store.disk.notify = lambda result: (gate.wait(5), deliver(result))
    kept = store.put("p", "kept", list(range(100)), bytearray(b"s" * 600))
    store.flush(0)  # written to disk behind the gate: in RAM until the write is delivered
    assert kept.in_ram
    budget = TokenBudget(0.1, 64, min_chunk=8, cost=StepCostModel(overhead=0.008, per_token=0.003),
                         background_itl_target=1.0)  # fmt: skip
    sched = Scheduler(n_ctx=1024, n_slots=4, ctx_per_seq=256, budget=budget, reserve=0,
                      tiers=store, costs=DiskDoneMidPlan(gate, store.disk))  # fmt: skip
    sched.add(request("new", list(range(100)) + [5, 6], 0.0))
    plan = sched.schedule(1.0)
    [restore] = plan.restores
    assert restore.data == bytearray(b"s" * 600)  # not None: llama.cpp would refuse it
    store.close()


class SlowSaves(SlowRestores):
    """Saves predicted to take `seconds` each."""

    def __init__(self, seconds: float):
        super().__init__(0.0001)
        self.save_s = seconds

    def save_seconds(self, n_tokens: int) -> float:
        return self.save_s


def hold_kv_in_idle_slots(sched: Scheduler) -> None:
    """Every idle slot holds another app's finished turn: a new request's slot is saved first."""
    for n, slot in enumerate(s for s in sched.cache.slots if not s.busy):
        slot.tokens, slot.partition = list(range(2000 + 100 * n, 2060 + 100 * n)), "q"
        slot.last_used = n


def test_a_save_that_overruns_the_itl_target_waits_beside_a_persons_stream_then_goes_unsaved():
    store = PromptStore(1 << 20)
    sched = scheduler(0.0001, store)
    sched.costs = SlowSaves(0.5)  # a save predicted at 0.5 s; the target is 0.1 s
    decoding_stream(sched, 0.0)
    hold_kv_in_idle_slots(sched)
    waiting = request("new", range(9000, 9040), 0.0)
    sched.add(waiting)
    plan = sched.schedule(0.1)
    assert waiting not in plan.admitted and not any(isinstance(op, KvSave) for op in plan.kv_ops)
    # ... until it has waited the loose background target: then without the save.
    plan = sched.schedule(1.2)
    assert waiting in plan.admitted and not any(isinstance(op, KvSave) for op in plan.kv_ops)
    assert plan.save_s == 0 and store.counts["dropped"] == 1


def test_a_save_that_fits_shares_the_step_and_shrinks_its_prompt_room():
    store = PromptStore(1 << 20)
    sched = scheduler(0.0001, store)
    sched.costs = SlowSaves(0.03)
    decoding_stream(sched, 0.0)
    hold_kv_in_idle_slots(sched)
    waiting = request("new", range(9000, 9060), 0.0)
    sched.add(waiting)
    plan = sched.schedule(0.1)
    assert waiting in plan.admitted and plan.save_s == pytest.approx(0.03)
    assert [op.seq_id for op in plan.kv_ops if isinstance(op, KvSave)] == [waiting.seq_id]
    # 0.08 s a step less 0.03 s of save: (0.05 - 0.008) / 0.003 = 14 tokens, 1 a decode.
    assert sum(len(c.tokens) for c in plan.chunks if c.request is waiting) == 13


def test_the_step_log_shows_what_each_step_spent_saving_and_restoring():
    engine, fake = warm_engine(slots=1)
    round_robin(engine, conversations(3), turns=2)
    steps = engine.snapshot()["steps"]
    assert len(steps["save_ms"]) == len(steps["restore_ms"]) == len(steps["ms"])
    assert fake.saves and sum(steps["save_ms"]) > 0 and sum(steps["restore_ms"]) > 0
    stop(engine)


class WatchedSaves(FakeRunner):
    """Notes, as each save copies a state, what the RAM tier counts then."""

    store: PromptStore | None = None

    def save(self, seq_id: int) -> bytearray:
        data = super().save(seq_id)
        self.seen.append((self.store.ram_used, len(data)))
        return data


def test_a_saves_copy_is_inside_the_ram_bound_while_it_is_made():
    store = PromptStore(1_000)
    fake = WatchedSaves(n_slots=1, n_ctx=256, per_token=0.0003)
    fake.store, fake.seen = store, []
    engine = Engine(fake, prompts=store, itl_target=1.0).start()
    round_robin(engine, conversations(4), turns=2)
    stop(engine)
    assert fake.seen and all(n <= used <= 1_000 for used, n in fake.seen)


def test_a_read_from_disk_takes_its_room_in_ram_before_it_allocates(tmp_path, monkeypatch):
    from inference.engine.tiers import files

    first = PromptStore(1 << 20, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    first.put("p", "kept", list(range(100)), bytearray(b"s" * 600))
    first.flush(5)
    first.close()
    store = PromptStore(1_000, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    store.put("p", "other", list(range(500, 600)), bytearray(b"o" * 700))
    read = files.read_payload
    seen = []

    def watched(path, layout, entry):
        seen.append(store.ram_used)
        return read(path, layout, entry)

    monkeypatch.setattr(files, "read_payload", watched)
    [kept] = [e for e in store.held() if e.cache_key == "kept"]
    assert store.fetch(kept)
    assert store.disk.drain(5)
    # Counted before it was read, and inside the bound: the other entry left RAM for it.
    assert seen and all(600 <= used <= 1_000 for used in seen)
    assert kept.in_ram and store.ram_used <= 1_000 and store.ram_peak <= 1_000
    store.close()


def test_a_dropped_entrys_state_counts_until_its_write_lets_go_of_it(tmp_path, monkeypatch):
    import threading

    from inference.engine.tiers import files

    gate = threading.Event()
    write = files.write_entry

    def slow(*args):
        assert gate.wait(5)
        return write(*args)

    monkeypatch.setattr(files, "write_entry", slow)
    store = PromptStore(1_000, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    store.put("p", "kept", list(range(100)), bytearray(b"s" * 600))
    store.flush(0)  # its write starts, and waits at the gate
    assert store.forget("p") == 1
    assert store.ram_used == 600  # the write job still holds the state
    gate.set()
    assert store.disk.drain(5)
    assert store.ram_used == 0 and list(store.disk.directory.glob("*.kv")) == []
    store.close()


class KvBuffers(FakeRunner):
    """A runner that says what its KV cache allocated, as the llama.cpp one does."""

    def info(self) -> dict:
        return {**super().info(), "buffers": {"kv": {"CPU": 1000 * self.n_ctx}}}


def test_the_first_save_is_predicted_from_the_kv_cache_llama_cpp_allocated():
    engine = Engine(KvBuffers(n_slots=1, n_ctx=256), prompts=PromptStore(1 << 20)).start()
    try:  # 8,000 tokens of 1,000 bytes: 8 MB, at the prior 2 GB/s
        assert engine.costs.save_seconds(8_000) >= 8e6 / 2e9
    finally:
        engine.shutdown()


def test_a_fetch_that_did_not_bring_its_entry_is_not_tried_again_for_that_request(
    tmp_path, monkeypatch
):
    import dataclasses
    import threading

    from inference.engine.tiers import files

    first = PromptStore(1 << 20, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    first.put("p", "kept", list(range(100)), bytearray(b"s" * 400))
    first.flush(5)
    first.close()
    # Another model's runner stopped and still writes its RAM tier: this one's RAM takes
    # nothing meanwhile, so the read finds no room and is given up.
    gate = threading.Event()
    write = files.write_entry
    monkeypatch.setattr(files, "write_entry", lambda *args: (gate.wait(10), write(*args))[1])
    stopping = PromptStore(1 << 20, DiskTier(tmp_path, dataclasses.replace(LAYOUT, model="cd" * 32),
                                             1 << 30)).open()  # fmt: skip
    stopping.put("p", "other", list(range(500, 600)), bytearray(b"o" * 400))
    flush = threading.Thread(target=stopping.flush, args=(10,))
    flush.start()
    while files.marked(stopping.disk.directory) != "flushing":
        gate.wait(0.01)
    store = PromptStore(1 << 20, DiskTier(tmp_path, LAYOUT, 1 << 30)).open()
    sched = scheduler(0.0001, store)
    waiting = request("first", list(range(100)) + [1], 0.0)
    sched.add(waiting)
    assert sched.schedule(0.1).admitted == [] and waiting.fetching
    assert store.disk.drain(5) and store.counts["no_room"] == 1
    gate.set()
    flush.join(10)
    stopping.close()
    sched.fetched()
    plan = sched.schedule(0.2)  # its entry is still on disk: not fetched again, read cold
    assert plan.admitted == [waiting] and waiting.cached_tokens == 0 and plan.restores == []
    store.close()
