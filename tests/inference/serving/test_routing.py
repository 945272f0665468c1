"""The router alone: every rule of inference.serving.routing and every refusal, on hand-built
announcements."""

import pytest

from inference.engine.refusals import RefusalKind
from inference.serving.announcement import LoadedModel, ServedModel, WorkerAnnouncement
from inference.serving.routing import (
    BY_PATH,
    CAN_LOAD,
    CONVERSATION,
    KEPT,
    LOADED,
    SECOND_COPY,
    SHARED_QUEUE,
    NoRoute,
    Wanted,
    route,
)

SHA = "ab" * 32
OTHER = "cd" * 32
GB = 10**9
MODEL = Wanted("smollm2", SHA)


def box(name, *, serves=(SHA,), loaded=(), ram=8 * GB, vram=None, running=0, size=GB, warm=()):
    return WorkerAnnouncement(
        worker=name, instance="i-" + name, host=name, queue=f"inference.{name}",
        serves=tuple(ServedModel(sha, size) for sha in serves), loaded=tuple(loaded),
        queue_depth=0, running=running, ram_free_bytes=ram, vram_free_bytes=vram, time=0.0,
        warm=tuple(warm),
    )  # fmt: skip


def copy(*, free=4, running=0, waiting=0, sha=SHA, name="smollm2"):
    return LoadedModel(name, sha, 2048, 4, free, running, waiting)


def go(workers, model=MODEL, **kw):
    return route(workers, model, shared_queue="inference", **kw)


def test_a_conversation_goes_back_to_its_worker_while_it_holds_the_model():
    workers = [box("a", loaded=[copy(running=3, free=1)]), box("b", loaded=[copy()])]
    chosen = go(workers, affinity="a")
    assert (chosen.worker, chosen.queue, chosen.reason) == ("a", "inference.a", CONVERSATION)


def test_a_conversation_whose_worker_is_gone_goes_to_another_that_has_the_model_loaded():
    chosen = go([box("b", loaded=[copy()])], affinity="a")
    assert (chosen.worker, chosen.reason) == ("b", LOADED)


def test_a_conversation_whose_worker_no_longer_has_the_model_loaded_is_routed_afresh():
    chosen = go([box("a"), box("b", loaded=[copy()])], affinity="a")
    assert (chosen.worker, chosen.reason) == ("b", LOADED)


def test_the_least_loaded_of_the_workers_with_the_model_loaded_is_chosen():
    workers = [box("a", loaded=[copy(running=3, free=1)]), box("b", loaded=[copy(running=1)])]
    assert go(workers).worker == "b"


def test_a_worker_with_the_model_loaded_goes_before_one_with_more_room():
    workers = [box("a", ram=64 * GB), box("b", ram=2 * GB, loaded=[copy()])]
    assert (go(workers).worker, go(workers).reason) == ("b", LOADED)


def test_a_loaded_model_is_matched_by_name_when_a_digest_is_unknown():
    workers = [box("a"), box("b", loaded=[copy(sha="")])]
    assert go(workers).worker == "b"
    assert go([box("a", loaded=[copy()])], Wanted("smollm2")).worker == "a"


def test_a_loaded_model_of_the_same_name_but_other_content_does_not_count():
    workers = [box("a", serves=(SHA, OTHER), loaded=[copy(sha=OTHER)]), box("b", ram=9 * GB)]
    assert (go(workers).worker, go(workers).reason) == ("b", CAN_LOAD)


def test_a_second_copy_is_loaded_only_when_every_copy_is_full_and_requests_wait():
    full = copy(free=0, running=4, waiting=2)
    chosen = go([box("a", loaded=[full]), box("b")])
    assert (chosen.worker, chosen.reason) == ("b", SECOND_COPY)
    busy_but_not_waiting = copy(free=0, running=4)
    assert go([box("a", loaded=[busy_but_not_waiting]), box("b")]).reason == LOADED


def test_full_copies_keep_the_request_when_no_other_worker_can_load_it():
    full = copy(free=0, running=4, waiting=2)
    chosen = go([box("a", loaded=[full]), box("b", serves=())])
    assert (chosen.worker, chosen.reason) == ("a", LOADED)


def test_a_worker_with_the_file_and_room_loads_it_most_free_memory_first():
    chosen = go([box("a", ram=2 * GB), box("b", ram=6 * GB), box("c", serves=(), ram=60 * GB)])
    assert (chosen.worker, chosen.reason) == ("b", CAN_LOAD)


def test_free_vram_counts_where_a_worker_has_a_gpu():
    chosen = go([box("a", ram=4 * GB), box("b", ram=1 * GB, vram=12 * GB)])
    assert chosen.worker == "b"


def test_a_worker_without_a_copy_is_never_chosen():
    chosen = go([box("empty", serves=(), ram=64 * GB), box("nas", ram=2 * GB)])
    assert chosen.worker == "nas"


def test_a_model_without_a_digest_may_go_to_any_worker_by_its_path():
    chosen = go([box("a", serves=()), box("b", serves=())], Wanted("new-import"))
    assert (chosen.worker, chosen.reason) == ("a", BY_PATH)


def test_with_nobody_announced_the_request_waits_in_the_shared_queue():
    chosen = go([])
    assert (chosen.worker, chosen.queue, chosen.reason) == (None, "inference", SHARED_QUEUE)


def test_a_worker_to_avoid_is_not_chosen_even_for_its_conversation():
    workers = [box("a", loaded=[copy()]), box("b")]
    chosen = go(workers, affinity="a", avoid=frozenset({"a"}))
    assert (chosen.worker, chosen.reason) == ("b", CAN_LOAD)


def test_with_every_worker_avoided_it_waits_in_the_shared_queue_for_one_to_start():
    chosen = go([box("a")], avoid=frozenset({"a"}))
    assert (chosen.worker, chosen.reason) == (None, SHARED_QUEUE)


def test_no_worker_with_a_copy_is_refused_naming_the_model_and_the_workers():
    with pytest.raises(NoRoute) as refused:
        go([box("a", serves=(OTHER,)), box("b", serves=())])
    assert refused.value.kind == RefusalKind.UNAVAILABLE
    message = refused.value.message
    assert "no inference worker has a copy of smollm2" in message
    assert SHA[:12] in message and "a, b" in message


def test_no_room_anywhere_is_refused_with_the_sizes():
    with pytest.raises(NoRoute) as refused:
        go([box("a", ram=GB // 2, size=3 * GB), box("b", serves=(), ram=64 * GB)])
    assert refused.value.kind == RefusalKind.NO_MEMORY
    assert refused.value.message == (
        "smollm2 (3.0 GB) fits on no inference worker that has it: a has 0.5 GB free"
    )


# --- kept prompts (warm memory) ---------------------------------------------------------------

TALK = "0123456789abcdef"  # a conversation's digest
TALKING = Wanted("smollm2", SHA, TALK)


def test_a_worker_that_keeps_the_conversation_counts_like_its_own_worker():
    workers = [box("a", loaded=[copy()]), box("b", loaded=[copy(running=2)], warm=[TALK])]
    chosen = go(workers, model=TALKING)  # its affinity expired: the announcement still knows
    assert (chosen.worker, chosen.reason) == ("b", KEPT)


def test_the_conversations_own_worker_still_comes_first():
    workers = [box("a", loaded=[copy()]), box("b", loaded=[copy()], warm=[TALK])]
    assert go(workers, model=TALKING, affinity="a").reason == CONVERSATION


def test_kept_prompts_on_a_worker_without_the_model_loaded_do_not_beat_a_loaded_copy():
    workers = [box("a", loaded=[copy()]), box("b", warm=[TALK])]
    assert (go(workers, model=TALKING).worker, go(workers, model=TALKING).reason) == ("a", LOADED)


def test_among_workers_that_can_load_it_the_one_keeping_the_conversation_loads_it():
    workers = [box("a", ram=16 * GB), box("b", ram=4 * GB, warm=[TALK])]
    chosen = go(workers, model=TALKING)
    assert (chosen.worker, chosen.reason) == ("b", CAN_LOAD)
    assert go(workers).worker == "a"  # without the conversation: the most free memory


def test_a_vision_model_goes_only_to_a_worker_with_its_projector_too():
    vision = Wanted("smollm2-vision", SHA, mmproj_sha256=OTHER)
    chosen = go([box("text-only", ram=64 * GB), box("both", serves=(SHA, OTHER), ram=3 * GB)],
                vision)  # fmt: skip
    assert (chosen.worker, chosen.reason) == ("both", CAN_LOAD)
    with pytest.raises(NoRoute, match="no inference worker has a copy of smollm2-vision"):
        go([box("text-only", ram=64 * GB)], vision)


def test_a_vision_model_needs_room_for_its_projector_as_well():
    vision = Wanted("smollm2-vision", SHA, mmproj_sha256=OTHER)
    with pytest.raises(NoRoute, match="fits on no inference worker"):
        go([box("tight", serves=(SHA, OTHER), ram=GB + GB // 2)], vision)
