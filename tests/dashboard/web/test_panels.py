"""The dashboard's panels, cut from real worker snapshots."""

import json

import pytest

from dashboard.web.panels import panels, shares_in
from inference.serving.client import get_client


def test_a_real_embedded_snapshot_gives_every_panel():
    snapshot = get_client().snapshots()[0]
    result = panels(snapshot)
    json.dumps(result, allow_nan=False)  # what the socket sends must be strict JSON
    assert result["worker"] == snapshot["worker"]
    assert result["mode"] == "embedded"
    assert result["memory"]["kind"] == ("gpu" if snapshot["system"]["gpus"] else "ram")
    assert result["memory"]["rss_bytes"] == snapshot["system"]["rss_bytes"]
    assert result["memory"]["runners_rss_bytes"] == snapshot["system"]["runners_rss_bytes"]
    assert isinstance(result["runners"], list)


def test_without_a_gpu_the_memory_panel_shows_the_workers_rss_and_model_size():
    memory = panels({"system": {"gpus": [], "rss_bytes": 300, "model_bytes": 100,
                                "runners_rss_bytes": 250,
                                "ram_total_bytes": 1000}})["memory"]  # fmt: skip
    assert (memory["kind"], memory["rss_bytes"], memory["model_bytes"]) == ("ram", 300, 100)
    assert memory["runners_rss_bytes"] == 250  # part of rss_bytes, shown next to it


def test_the_runners_panel_shows_each_runner_with_times_relative_to_the_snapshot():
    note = (
        "CPU self-check: the runner killed by signal 11 (SIGSEGV) during load with llama.cpp's "
        "extra buffer types (AMX, repacking), so models on this host load without them"
    )
    snapshot = {"time": 1000.0, "runners": [
        {"model": "b", "state": "backing off", "pid": None, "restarts": 2, "crashes_in_a_row": 3,
         "last_exit": "killed by signal 11 (SIGSEGV) during decode", "last_exit_at": 990.5,
         "retry_in": 3.5, "extra_bufts": False, "note": note},
        {"model": "a", "state": "running", "pid": 4242, "restarts": 0, "crashes_in_a_row": 0,
         "last_exit": None, "last_exit_at": None, "retry_in": None, "extra_bufts": True,
         "note": ""},
    ]}  # fmt: skip
    result = panels(snapshot)
    json.dumps(result, allow_nan=False)
    a, b = result["runners"]  # by model name
    assert a == {"model": "a", "state": "running", "pid": 4242, "restarts": 0,
                 "crashes_in_a_row": 0, "last_exit": None, "last_exit_ago": None,
                 "retry_in": None, "extra_bufts": True, "note": ""}  # fmt: skip
    assert (b["state"], b["restarts"], b["crashes_in_a_row"]) == ("backing off", 2, 3)
    # The worker's clock on both sides: the browser adds what passed since the snapshot came.
    assert (b["last_exit_ago"], b["retry_in"]) == (9.5, 3.5)
    assert b["last_exit"] == "killed by signal 11 (SIGSEGV) during decode"
    assert (b["extra_bufts"], b["note"]) == (False, note)


def test_runner_rows_from_a_worker_are_not_trusted_as_they_come():
    result = panels({"time": 10.0, "runners": [
        "x", {"state": "running"}, {"model": ""},
        {"model": "m", "state": "<b>on fire</b>", "pid": "1", "restarts": float("inf"),
         "last_exit": 5, "last_exit_at": 20.0, "retry_in": -1.0, "note": None},
    ]})  # fmt: skip
    json.dumps(result, allow_nan=False)
    (row,) = result["runners"]
    assert (row["model"], row["state"], row["pid"], row["restarts"]) == ("m", "unknown", None, 0)
    assert (row["last_exit"], row["retry_in"], row["note"]) == (None, None, "")
    assert row["last_exit_ago"] == 0.0  # an exit "after" the snapshot: clock skew, not the future
    assert panels({"runners": {"m": {}}})["runners"] == []


def test_several_models_add_their_throughput_and_report_their_worst_latency():
    def engine(prompt, output, ttft_p95, kv):
        return {"prompt_tps": prompt, "output_tps": output, "queue_depth": 1,
                "active_sequences": 2, "kv_fill": kv, "outcomes": {"stop": 1},
                "ttft": {"p50": 0.1, "p95": ttft_p95, "p99": None, "max": 1.0},
                "itl": {}}  # fmt: skip

    result = panels({"models": {"a": engine(800.0, 30.0, 0.4, 0.2),
                                "b": engine(100.0, 10.0, 0.9, 0.6)}})  # fmt: skip
    assert (result["prompt_tps"], result["output_tps"]) == (900.0, 40.0)
    assert result["ttft"] == {"p50": 0.1, "p95": 0.9, "p99": None, "max": 1.0}
    assert result["itl"] == {"p50": None, "p95": None, "p99": None, "max": None}
    assert (result["queue_depth"], result["active_sequences"], result["finished"]) == (2, 4, 2)
    assert result["kv_fill"] == 0.6


@pytest.mark.parametrize("junk", [{}, {"models": {"a": "x"}, "system": "y", "loaded": ["z"]},
                                  {"models": {"a": {"prompt_tps": float("nan")}}}])
def test_a_malformed_snapshot_gives_empty_panels_rather_than_an_error(junk):
    result = panels(junk)
    json.dumps(result, allow_nan=False)
    assert result["prompt_tps"] == 0.0
    assert result["runners"] == []


def window(prompt, output, ttft_p95, itl_max, series_output):
    return {"seconds": 30, "prompt_tps": prompt, "output_tps": output, "busy_fraction": 0.5,
            "ended": 2, "ttft": {"p50": 0.1, "p95": ttft_p95, "p99": ttft_p95, "max": 1.0,
                                 "count": 2},
            "itl": {"p50": 0.02, "p95": 0.03, "p99": 0.04, "max": itl_max, "count": 100},
            "series": {"step_s": 1.0, "output_tps": series_output,
                       "itl_p95": [None] * 29 + [itl_max]}}  # fmt: skip


def test_the_windows_of_several_models_add_throughput_and_keep_the_worst_latency():
    result = panels({"models": {
        "a": {"windows": {"30": window(800.0, 30.0, 0.4, 0.1, [1.0] * 30)}},
        "b": {"windows": {"30": window(100.0, 10.0, 0.9, 0.5, [2.0] * 30)}},
    }})  # fmt: skip
    json.dumps(result, allow_nan=False)
    short = result["windows"]["30"]
    assert (short["prompt_tps"], short["output_tps"], short["ended"]) == (900.0, 40.0, 4)
    assert (short["ttft"]["p95"], short["itl"]["max"]) == (0.9, 0.5)
    assert short["ttft"]["count"] == 4 and short["itl"]["count"] == 200
    assert short["series"]["output_tps"] == [3.0] * 30  # point by point
    assert short["series"]["itl_p95"][-1] == 0.5 and short["series"]["itl_p95"][0] is None
    assert len(short["series"]["ttft_p50"]) == 30  # missing columns are padded, not absent
    # A window no model reported reads 0 and none, never a stale number.
    assert result["windows"]["3600"]["output_tps"] == 0.0
    assert result["windows"]["3600"]["itl"]["p50"] is None


def test_the_step_columns_are_bounded_and_aligned_whatever_a_worker_sends():
    steps = {"ago": [float(i) for i in range(500, 0, -1)], "decode": [1] * 500,
             "prompt": [30] * 499 + [float("nan")], "ms": [20.0] * 500, "seqs": [2] * 10}
    model = panels({"models": {"m": {"steps": steps}}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    cut = model["steps"]
    assert {len(column) for column in cut.values() if column is not None} == {10}  # common tail
    assert cut["ago"] == [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert cut["prompt"][-1] == 0 and all(isinstance(v, int) for v in cut["decode"])
    full = panels({"models": {"m": {"steps": {**steps, "seqs": [2] * 500}}}})["models"]["m"]
    assert len(full["steps"]["ago"]) == 300


def test_each_running_stream_is_listed_with_its_model_and_checked_fields():
    streams = [{"id": "abcdef0123456789", "phase": "decoding", "prompt_tokens": 100,
                "cached_tokens": 40, "computed": 100, "output_tokens": 12, "max_tokens": 512,
                "tps": 21.5, "last_token_ago": 0.04, "age": 3.0},
               {"id": "<script>", "phase": "<b>", "tps": "fast"}, "junk"]  # fmt: skip
    result = panels({"models": {"m": {"streams": streams}}})
    json.dumps(result, allow_nan=False)
    first, second = result["streams"]
    assert (first["model"], first["id"], first["tps"]) == ("m", "abcdef01", 21.5)
    assert (second["phase"], second["tps"], second["id"]) == ("prefilling", None, "<script>")


def engine_with_priorities() -> dict:
    """An engine snapshot with fair share: streams with their share, priority and pause, the
    shares, and the step columns of background work."""
    return {
        "window_s": 10.0,
        "streams": [
            {"id": "aaaa1111bbbb", "phase": "decoding", "priority": "interactive",
             "share": "user:1", "paused": False, "output_tokens": 5},
            {"id": "cccc2222dddd", "phase": "decoding", "priority": "background",
             "share": "apikey:3", "paused": True, "output_tokens": 40},
        ],
        "shares": [
            {"share": "apikey:3", "priority": "background", "running": 4, "waiting": 8,
             "paused": 1, "tokens_recent": 900},
            {"share": "user:1", "priority": "interactive", "running": 1, "waiting": 0,
             "paused": 0, "tokens_recent": 100},
        ],
        "steps": {"ago": [2.0, 1.0, 0.5], "decode": [5, 4, 4], "prompt": [0, 64, 0],
                  "ms": [40.0, 90.0, 35.0], "seqs": [5, 5, 4],
                  "background": [4, 4, 9], "interactive": [1, 0, 1], "paused": [0, 1, 1]},
    }  # fmt: skip


def test_streams_and_shares_say_whose_turn_and_which_priority():
    result = panels({"models": {"m": engine_with_priorities()}})
    json.dumps(result, allow_nan=False)
    fields = ("share", "priority", "paused")
    person, batch = (tuple(row[k] for k in fields) for row in result["streams"])
    assert person == ("user:1", "interactive", False)
    assert batch == ("apikey:3", "background", True)
    # Sorted by share, so the table keeps its order from one snapshot to the next.
    assert result["shares"] == [
        {"share": "apikey:3", "priority": "background", "running": 4, "waiting": 8,
         "paused": 1, "tokens_recent": 900},
        {"share": "user:1", "priority": "interactive", "running": 1, "waiting": 0,
         "paused": 0, "tokens_recent": 100},
    ]  # fmt: skip
    assert result["models"]["m"]["window_s"] == 10.0
    assert result["apps"] == {}  # the consumer names them
    assert shares_in(result) == {"apikey:3", "user:1"}


def test_several_models_add_up_each_share_at_each_priority():
    a = engine_with_priorities()
    b = {"shares": [
        {"share": "apikey:3", "priority": "background", "running": 1, "waiting": 2,
         "paused": 0, "tokens_recent": 50},
        {"share": "apikey:3", "priority": "interactive", "running": 1, "waiting": 0,
         "paused": 0, "tokens_recent": 7},
        {"share": None, "priority": "interactive", "running": 1, "tokens_recent": 3},
    ]}  # fmt: skip
    shares = panels({"models": {"a": a, "b": b}})["shares"]
    assert [(r["share"], r["priority"]) for r in shares] == [
        ("apikey:3", "interactive"), ("apikey:3", "background"), ("user:1", "interactive"),
        (None, "interactive"),
    ]  # fmt: skip
    background = shares[1]
    assert (background["running"], background["waiting"], background["paused"]) == (5, 10, 1)
    assert background["tokens_recent"] == 950


def test_the_step_columns_of_background_work_are_kept_aligned_and_bounded():
    steps = panels({"models": {"m": engine_with_priorities()}})["models"]["m"]["steps"]
    assert steps["interactive"] == [1, 0, 1]
    assert steps["paused"] == [0, 1, 1]
    assert steps["background"] == [4, 4, 4]  # a part of the decode tokens, never more
    ragged = {**engine_with_priorities()["steps"], "paused": [1, float("nan")],
              "interactive": [7, -1, "x"]}  # fmt: skip
    cut = panels({"models": {"m": {"steps": ragged}}})["models"]["m"]["steps"]
    json.dumps(cut, allow_nan=False)
    assert {len(column) for column in cut.values() if column is not None} == {2}  # common tail
    assert (cut["paused"], cut["interactive"]) == ([1, 0], [0, 0])


def test_an_engine_from_before_fair_share_reads_as_before():
    old = {"streams": [{"id": "abcdef0123", "phase": "decoding", "priority": "interactive"}],
           "steps": {"ago": [1.0], "decode": [1], "prompt": [0], "ms": [20.0],
                     "seqs": [1]}}  # fmt: skip
    result = panels({"models": {"m": old}})
    json.dumps(result, allow_nan=False)
    (stream,) = result["streams"]
    assert (stream["share"], stream["priority"], stream["paused"]) == (None, "interactive", False)
    assert result["shares"] is None and result["models"]["m"]["shares"] is None  # not [], absent
    steps = result["models"]["m"]["steps"]
    assert (steps["background"], steps["interactive"], steps["paused"]) == (None, None, None)
    assert steps["decode"] == [1]
    assert shares_in(result) == set()
    # One new engine beside an old one: the shares it reports are the worker's.
    mixed = panels({"models": {"old": old, "new": engine_with_priorities()}})
    assert [r["share"] for r in mixed["shares"]] == ["apikey:3", "user:1"]


def test_share_rows_from_a_worker_are_not_trusted_as_they_come():
    engine = {"shares": [
        "junk", {"share": 5, "priority": "urgent", "running": "4", "waiting": float("inf")},
        {"share": "apikey:1:user:" + "x" * 500, "priority": "background", "paused": -0.0},
    ], "streams": [{"share": ["user:1"], "priority": "top", "paused": "yes"}]}  # fmt: skip
    result = panels({"models": {"m": engine}})
    json.dumps(result, allow_nan=False)
    first, second = result["shares"]
    assert (first["share"], first["priority"], first["running"], first["waiting"]) == (
        "apikey:1:user:" + "x" * 186, "background", 0, 0)  # fmt: skip
    assert (second["share"], second["priority"]) == (None, "interactive")
    (stream,) = result["streams"]
    assert (stream["share"], stream["priority"], stream["paused"]) == (None, "interactive", False)
    assert panels({"models": {"m": {"shares": {"apikey:1": {}}}}})["shares"] is None


def warm_engine() -> dict:
    """An engine with warm memory and speculation, as Engine.snapshot() gives them: a RAM tier
    near its bound, a disk tier, admissions from every tier, and a stream that drafts."""
    return {
        "prompt_cache": {
            "enabled": True,
            "use": {"admitted": {"resident": 12, "ram": 5, "disk": 2, "miss": 6},
                    "tokens": {"resident": 5400, "ram": 2100, "disk": 900},
                    "restore_seconds": 0.08, "saved_seconds": 11.5},
            "restore_bytes_per_s": 9.5e9, "disk_bytes_per_s": 1.2e9,
            "ram": {"bytes": 700 << 20, "bound": 1 << 30, "entries": 14, "peak": 900 << 20},
            "disk": {"bytes": 3 << 30, "entries": 40, "bound": 20 << 30, "enabled": True,
                     "note": "dropped 3 entries: longer than this load's context (2048 tokens)"},
            "saved": 60, "spilled": 40, "dropped": 1, "fetched": 2, "unreadable": 1,
            "spill_failed": 0, "forgotten": 3, "conversations": ["ab12", "cd34"],
        },
        "speculation": {"enabled": True, "mode": "auto", "drafted": 48, "accepted": 47,
                        "drafts": 6, "verify_tokens": 48, "acceptance": 47 / 48,
                        "table_contexts": 120},
        # Three steps: one stream drafting 8 and keeping 7 (8 tokens written), the same with a
        # prompt chunk read beside it, two streams without drafts.
        "steps": {"ago": [3.0, 2.0, 1.0], "decode": [9, 9, 2], "prompt": [0, 64, 0],
                  "ms": [40.0, 90.0, 30.0], "seqs": [1, 2, 2],
                  "verify": [8, 8, 0], "output": [8, 9, 2]},
    }  # fmt: skip


def test_the_kept_prompts_panel_shows_each_tier_against_its_bound_and_what_it_served():
    result = panels({"models": {"m": warm_engine()}})
    json.dumps(result, allow_nan=False)
    kept = result["models"]["m"]["prompt_cache"]
    assert kept["enabled"] is True
    assert kept["ram"] == {"bytes": 700 << 20, "bound": 1 << 30, "entries": 14}
    assert kept["disk"] == {"bytes": 3 << 30, "bound": 20 << 30, "entries": 40}
    assert kept["disk_note"] == "dropped 3 entries: longer than this load's context (2048 tokens)"
    assert kept["admitted"] == {"resident": 12, "ram": 5, "disk": 2, "miss": 6}
    assert kept["tokens"] == {"resident": 5400, "ram": 2100, "disk": 900}
    assert (kept["saved_s"], kept["restore_s"]) == (11.5, 0.08)
    assert (kept["restore_bytes_per_s"], kept["disk_bytes_per_s"]) == (9.5e9, 1.2e9)
    assert (kept["saved"], kept["spilled"], kept["dropped"], kept["unreadable"]) == (60, 40, 1, 1)
    assert "conversations" not in kept  # digests for the router, nothing for a person


def test_without_warm_memory_the_panel_says_so_and_keeps_the_resident_reuse():
    engine = warm_engine()
    engine["prompt_cache"] = {
        "enabled": False, "restore_bytes_per_s": 2e9, "disk_bytes_per_s": 2e8,
        "use": {"admitted": {"resident": 3, "ram": 0, "disk": 0, "miss": 1},
                "tokens": {"resident": 800, "ram": 0, "disk": 0},
                "restore_seconds": 0.0, "saved_seconds": 0.0},
    }  # fmt: skip
    kept = panels({"models": {"m": engine}})["models"]["m"]["prompt_cache"]
    assert kept["enabled"] is False
    assert (kept["ram"], kept["disk"], kept["restore_bytes_per_s"]) == (None, None, None)
    assert kept["admitted"]["resident"] == 3 and kept["tokens"]["resident"] == 800
    # A RAM tier alone: no disk panel, no disk rate.
    ram_only = warm_engine()
    ram_only["prompt_cache"]["disk"] = {"bytes": 0, "entries": 0, "bound": 0, "enabled": False}
    kept = panels({"models": {"m": ram_only}})["models"]["m"]["prompt_cache"]
    assert kept["ram"] is not None and kept["disk"] is None and kept["disk_bytes_per_s"] is None


def test_kept_prompt_figures_from_a_worker_are_not_trusted_as_they_come():
    junk = {"enabled": True, "use": {"admitted": {"ram": "5", "miss": -4, "disk": float("nan")},
                                     "tokens": [1, 2], "saved_seconds": float("inf")},
            "restore_bytes_per_s": -1.0, "disk_bytes_per_s": "fast",
            "ram": {"bytes": 2 << 30, "bound": 1 << 30, "entries": True},
            "disk": {"enabled": "yes", "bytes": 5}, "saved": None, "dropped": "1"}  # fmt: skip
    kept = panels({"models": {"m": {"prompt_cache": junk}}})["models"]["m"]["prompt_cache"]
    json.dumps(kept, allow_nan=False)
    assert kept["admitted"] == {"resident": 0, "ram": 0, "disk": 0, "miss": 0}
    assert kept["tokens"] == {"resident": 0, "ram": 0, "disk": 0}
    assert (kept["saved_s"], kept["restore_bytes_per_s"]) == (0.0, None)
    # Over its bound is shown as it is: that the bound holds is what the panel is for.
    assert kept["ram"] == {"bytes": 2 << 30, "bound": 1 << 30, "entries": 0}
    assert kept["disk"] is None  # "yes" is not true
    noted = warm_engine()["prompt_cache"]
    noted["disk"]["note"] = ["dropped"]
    assert panels({"models": {"m": {"prompt_cache": noted}}})["models"]["m"]["prompt_cache"][
        "disk_note"] == ""  # fmt: skip
    assert kept["saved"] == 0 and kept["dropped"] == 0
    assert panels({"models": {"m": {"prompt_cache": "on"}}})["models"]["m"]["prompt_cache"] is None


def test_speculation_shows_what_was_drafted_and_kept_and_tokens_per_step():
    model = panels({"models": {"m": warm_engine()}})["models"]["m"]
    speculation = model["speculation"]
    assert speculation == {"enabled": True, "mode": "auto", "drafted": 48, "accepted": 47,
                           "drafts": 6, "acceptance": 47 / 48}  # fmt: skip
    # The step that read a prompt is left out (its prompt's first token is sampled too): one
    # stream's step wrote 8 tokens, then two streams wrote one each.
    assert model["step_yield"] == {"stream_steps": 3, "tokens": 10}
    assert model["steps"]["verify"] == [8, 8, 0] and model["steps"]["output"] == [8, 9, 2]


def test_speculation_figures_from_a_worker_are_not_trusted_as_they_come():
    engine = {"speculation": {"enabled": True, "mode": "<b>turbo</b>", "drafted": 10,
                              "accepted": 50, "acceptance": 5.0},
              "steps": {"ago": [1.0, 2.0], "decode": [2, 1], "prompt": [0, 0], "ms": [1.0, 1.0],
                        "seqs": [1, 1], "verify": [9, -3], "output": [3, "x"]}}  # fmt: skip
    model = panels({"models": {"m": engine}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    assert model["speculation"]["mode"] == "unknown"
    assert model["speculation"]["accepted"] == 10  # never more than were drafted
    assert model["speculation"]["acceptance"] == 1.0
    assert model["steps"]["verify"] == [2, 0]  # a part of the decode tokens, never more
    assert model["step_yield"] == {"stream_steps": 1, "tokens": 0}  # the first step: all verify
    off = panels({"models": {"m": {"speculation": {"enabled": False}}}})["models"]["m"]
    assert (off["speculation"]["mode"], off["speculation"]["acceptance"]) == ("off", None)


def test_an_engine_from_before_warm_memory_and_speculation_reads_as_before():
    old = {"steps": {"ago": [1.0], "decode": [1], "prompt": [0], "ms": [20.0], "seqs": [1]}}
    model = panels({"models": {"m": old}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    assert (model["prompt_cache"], model["speculation"], model["step_yield"]) == (None, None, None)
    assert (model["steps"]["verify"], model["steps"]["output"]) == (None, None)


def test_a_real_engine_snapshot_gives_the_warm_memory_and_speculation_panels():
    from inference.engine.engine import Engine
    from inference.engine.speculation.policy import Speculation
    from inference.engine.tiers import PromptStore
    from tests.inference.engine.fakes import FakeRunner

    engine = Engine(FakeRunner(), name="m", prompts=PromptStore(1 << 20),
                    speculation=Speculation("auto")).start()  # fmt: skip
    try:
        model = panels({"models": {"m": engine.snapshot()}})["models"]["m"]
    finally:
        engine.shutdown()
    json.dumps(model, allow_nan=False)
    assert model["prompt_cache"]["enabled"] and model["prompt_cache"]["ram"]["bound"] == 1 << 20
    assert model["speculation"]["mode"] == "auto"
    assert model["step_yield"] == {"stream_steps": 0, "tokens": 0}  # no step yet


def test_the_steps_say_which_prompt_tokens_were_images_and_when_the_encoder_was_busy():
    engine = {"steps": {"ago": [3.0, 2.0, 1.0], "decode": [1, 1, 0], "prompt": [0, 70, 200],
                        "ms": [9.0, 40.0, 80.0], "seqs": [1, 2, 1], "image": [0, 64, 900],
                        "encoding": [1, 0, -2]},
              "vision": {"encoding": 1, "requests": 1, "images_encoded": 3, "images_cached": 2,
                         "encode_seconds": 0.55, "failed": 0, "cache": {"entries": 2}}}  # fmt: skip
    model = panels({"models": {"m": engine}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    assert model["steps"]["image"] == [0, 64, 200]  # a part of the prompt tokens, never more
    assert model["steps"]["encoding"] == [1, 0, 0]
    assert model["vision"] == {"encoding": 1, "requests": 1, "images_encoded": 3,
                               "images_cached": 2, "encode_s": 0.55, "failed": 0}  # fmt: skip


def test_a_model_without_images_has_no_vision_panel_and_no_image_columns():
    old = {"steps": {"ago": [1.0], "decode": [1], "prompt": [0], "ms": [20.0], "seqs": [1]},
           "vision": None}  # fmt: skip
    model = panels({"models": {"m": old}})["models"]["m"]
    assert model["vision"] is None
    assert (model["steps"]["image"], model["steps"]["encoding"]) == (None, None)
    junk = panels({"models": {"m": {"vision": {"encoding": "busy", "encode_seconds": -1,
                                               "images_encoded": float("nan")}}}})  # fmt: skip
    json.dumps(junk, allow_nan=False)
    vision = junk["models"]["m"]["vision"]
    assert (vision["encoding"], vision["encode_s"], vision["images_encoded"]) == (0, 0.0, 0)


def test_the_steps_say_how_much_of_their_target_they_used_and_how_far_off_the_prediction_was():
    engine = {"steps": {"ago": [4.0, 3.0, 2.0, 1.0], "decode": [4, 4, 0, 2],
                        "prompt": [10, 12, 300, 0], "ms": [80.0, 100.0, 900.0, 30.0],
                        "seqs": [5, 5, 1, 2], "target_ms": [100.0, 100.0, 0.0, 100.0],
                        "predicted_ms": [80.0, 80.0, 850.0, 30.0]}}  # fmt: skip
    model = panels({"models": {"m": engine}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    assert model["steps"]["target_ms"] == [100.0, 100.0, 0.0, 100.0]
    # The prompt-only step with nobody decoding had no target: it is left out.
    assert model["step_budget"] == {"steps": 3, "used_p50": 0.8, "used_p90": 1.0,
                                    "error_p90": 1.25}  # fmt: skip


def test_budget_figures_from_a_worker_are_not_trusted_as_they_come():
    engine = {"steps": {"ago": [2.0, 1.0], "decode": [1, 1], "prompt": [0, 0], "ms": [10.0, 10.0],
                        "seqs": [1, 1], "target_ms": [-5, "x"],
                        "predicted_ms": [float("nan"), 5]}}  # fmt: skip
    model = panels({"models": {"m": engine}})["models"]["m"]
    json.dumps(model, allow_nan=False)
    assert model["steps"]["target_ms"] == [0.0, 0.0]
    assert model["step_budget"] is None  # no step says a target bound it
    before = {"steps": {"ago": [1.0], "decode": [1], "prompt": [0], "ms": [20.0], "seqs": [1]}}
    assert panels({"models": {"m": before}})["models"]["m"]["step_budget"] is None


def test_a_real_engine_logs_each_steps_target_and_prediction():
    from inference.engine.engine import Engine
    from inference.engine.generation import GenerationRequest
    from inference.engine.params import SamplingParams
    from tests.inference.engine.fakes import FakeRunner

    engine = Engine(FakeRunner(), name="m", itl_target=0.05).start()
    try:
        handle = engine.submit(GenerationRequest([1, 2, 3, 4], SamplingParams(max_tokens=6)))
        assert handle.result(timeout=10).type == "done"
        model = panels({"models": {"m": engine.snapshot()}})["models"]["m"]
    finally:
        engine.shutdown()
    steps = model["steps"]
    assert steps["target_ms"][0] == 0.0  # the prompt, nobody decoding: no target bound it
    assert set(steps["target_ms"][1:]) == {50.0}  # then a person's stream: the ITL target
    assert all(p > 0 for p in steps["predicted_ms"])
    assert model["step_budget"]["steps"] == len(steps["ms"]) - 1
