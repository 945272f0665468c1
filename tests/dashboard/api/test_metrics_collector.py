"""The /metrics collector on a worker snapshot with GPUs (this box has none, so the live tests
cannot see the GPU series): every reading becomes its series, labelled by worker and GPU."""

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dashboard.api.metrics import render
from inference.engine import Engine, GenerationRequest
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.telemetry import Telemetry, _Histogram
from tests.inference.engine.fakes import FakeVisionRunner
from tests.inference.projector_gguf import picture


def older_engine(snapshot: dict) -> dict:
    """The same worker snapshot as an engine from before priorities gives it: no by_priority."""
    for engine in snapshot["models"].values():
        engine.pop("by_priority", None)
    return snapshot


def snapshot_with_gpus() -> dict:
    telemetry = Telemetry()
    telemetry.record_step(1.0, prompt=20, output=1, seqs=1, seconds=0.05)
    telemetry.record_first_token(ttft=0.2, queue_time=0.01, prefill_time=0.1)
    telemetry.record_token_gap(0.03)
    telemetry.record_outcome("stop", e2e=0.5, cached=4)
    engine = {**telemetry.snapshot(1.0), "active_sequences": 2, "queue_depth": 3, "kv_fill": 0.25}
    gpus = [
        {"index": i, "used_bytes": 1000 * (i + 1), "total_bytes": 8000, "process_bytes": 500}
        for i in range(2)
    ]
    return {
        "worker": "box-1",
        "loading": None,
        "loaded": [{"name": "m"}],
        "models": {"m": engine},
        "system": {"gpus": gpus, "rss_bytes": 123, "model_bytes": 456},
    }


def parsed(snapshots: list[dict]) -> dict:
    text = render(lambda: snapshots).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_gpu_memory_is_exported_per_worker_and_device():
    found = parsed([snapshot_with_gpus()])
    assert found[("appliance_gpu_memory_used_bytes", (("gpu", "1"), ("worker", "box-1")))] == 2000
    assert found[("appliance_gpu_memory_total_bytes", (("gpu", "0"), ("worker", "box-1")))] == 8000
    assert found[("appliance_gpu_memory_process_bytes", (("gpu", "0"), ("worker", "box-1")))] == 500


def test_engine_figures_become_counters_gauges_and_histograms():
    found = parsed([snapshot_with_gpus()])
    model = (("model", "m"), ("worker", "box-1"))
    assert found[("appliance_prompt_tokens_total", model)] == 20
    assert found[("appliance_cached_prompt_tokens_total", model)] == 4
    assert found[("appliance_generation_tokens_total", model)] == 1
    assert (
        found[
            ("appliance_requests_total", (("model", "m"), ("outcome", "stop"), ("worker", "box-1")))
        ]
        == 1
    )
    assert found[("appliance_requests_running", model)] == 2
    assert found[("appliance_requests_waiting", model)] == 3
    assert found[("appliance_kv_cache_usage_ratio", model)] == 0.25
    ttft = (("model", "m"), ("priority", "interactive"), ("worker", "box-1"))
    assert found[("appliance_time_to_first_token_seconds_count", ttft)] == 1
    assert found[("appliance_time_to_first_token_seconds_sum", ttft)] == 0.2
    assert found[("appliance_time_to_first_token_seconds_bucket", (("le", "0.2"), *ttft))] == 1
    assert found[("appliance_time_to_first_token_seconds_bucket", (("le", "0.15"), *ttft))] == 0
    assert found[("appliance_e2e_request_latency_seconds_count", model)] == 1
    assert found[("appliance_models_loaded", (("worker", "box-1"),))] == 1
    assert found[("appliance_process_resident_memory_bytes", (("worker", "box-1"),))] == 123


def test_no_worker_means_no_series_and_no_error():
    assert parsed([]) == {}


def test_each_runner_is_up_or_not_and_counts_its_restarts():
    snapshot = snapshot_with_gpus()
    snapshot["runners"] = [
        {"model": "m", "state": "running", "restarts": 2},
        {"model": "broken", "state": "backing off", "restarts": 5},
    ]
    found = parsed([snapshot])
    broken = (("model", "broken"), ("worker", "box-1"))
    assert found[("appliance_runner_up", (("model", "m"), ("worker", "box-1")))] == 1
    assert found[("appliance_runner_up", broken)] == 0
    assert found[("appliance_runner_restarts_total", broken)] == 5


def histogram_of(*values: float) -> dict:
    histogram = _Histogram()
    for value in values:
        histogram.observe(value)
    return histogram.export()


def snapshot_by_priority() -> dict:
    """An engine that reports TTFT and ITL by priority: two interactive first tokens, one
    background, and their gaps; the whole histograms are what they add up to."""
    snapshot = snapshot_with_gpus()
    engine = snapshot["models"]["m"]
    engine["by_priority"] = {
        "interactive": {"ttft": {}, "itl": {}, "histograms": {
            "ttft": histogram_of(0.1, 0.3), "itl": histogram_of(0.02, 0.03, 0.04)}},
        "background": {"ttft": {}, "itl": {}, "histograms": {
            "ttft": histogram_of(4.0), "itl": histogram_of(0.9)}},
    }  # fmt: skip
    engine["histograms"]["ttft"] = histogram_of(0.1, 0.3, 4.0)
    engine["histograms"]["itl"] = histogram_of(0.02, 0.03, 0.04, 0.9)
    engine["shares"] = [{"share": "apikey:3", "priority": "background", "running": 1,
                         "waiting": 0, "paused": 0, "tokens_recent": 10}]  # fmt: skip
    return snapshot


def test_ttft_and_itl_are_split_by_priority_in_their_own_families():
    found = parsed([snapshot_by_priority()])
    model = (("model", "m"), ("worker", "box-1"))

    def by(name: str, priority: str, *extra) -> float:
        return found[(name, tuple(sorted((*model, ("priority", priority), *extra))))]

    ttft, itl = "appliance_time_to_first_token_seconds", "appliance_inter_token_latency_seconds"
    assert by(ttft + "_count", "interactive") == 2 and by(ttft + "_count", "background") == 1
    assert by(ttft + "_sum", "background") == 4.0
    assert by(ttft + "_bucket", "interactive", ("le", "0.3")) == 2
    assert by(ttft + "_bucket", "background", ("le", "2.5")) == 0
    assert by(itl + "_count", "interactive") == 3 and by(itl + "_count", "background") == 1
    # The priorities add up to every request: no unlabelled total beside them to count twice.
    assert sum(by(ttft + "_count", p) for p in ("interactive", "background")) == 3
    assert not [k for k in found if k[0] == ttft + "_count" and "priority" not in dict(k[1])]
    # The label is bounded: two values, never a key or a user; other histograms have none.
    priorities = {dict(labels).get("priority") for _, labels in found} - {None}
    assert priorities == {"interactive", "background"}
    assert not [key for key in found if "apikey:3" in str(key)]
    assert ("appliance_e2e_request_latency_seconds_count", model) in found


def test_an_engine_without_priorities_exports_its_one_histogram_with_priority_empty():
    found = parsed([older_engine(snapshot_with_gpus())])
    model = (("model", "m"), ("priority", ""), ("worker", "box-1"))
    assert found[("appliance_time_to_first_token_seconds_count", model)] == 1
    assert found[("appliance_inter_token_latency_seconds_count", model)] == 1
    # A new engine and an old one side by side (two workers in split mode): both kinds of series.
    old = older_engine(snapshot_with_gpus())
    old["worker"] = "old-box"
    both = parsed([snapshot_by_priority(), old])
    count = "appliance_time_to_first_token_seconds_count"
    assert both[(count, (("model", "m"), ("priority", ""), ("worker", "old-box")))] == 1
    assert both[(count, (("model", "m"), ("priority", "background"), ("worker", "box-1")))] == 1


def test_a_malformed_split_falls_back_to_the_whole_histogram_and_never_fails_the_scrape():
    snapshot = snapshot_by_priority()
    engine = snapshot["models"]["m"]
    engine["by_priority"]["background"] = "junk"  # one priority missing: the split is not whole
    engine["histograms"]["itl"] = {"buckets": [0.1], "cumulative": [1, 2], "sum": 1.0}
    found = parsed([snapshot])
    model = (("model", "m"), ("priority", ""), ("worker", "box-1"))
    assert found[("appliance_time_to_first_token_seconds_count", model)] == 3
    assert not [key for key in found if key[0].startswith("appliance_inter_token_latency")]
    assert found[("appliance_request_queue_time_seconds_count", model[::2])] == 1


def warm_snapshot() -> dict:
    """A worker whose engine keeps prompts in RAM and on disk and speculates, as
    Engine.snapshot() reports them (inference.engine.tiers, inference.engine.speculation)."""
    snapshot = snapshot_with_gpus()
    snapshot["models"]["m"]["prompt_cache"] = {
        "enabled": True,
        "use": {"admitted": {"resident": 12, "ram": 5, "disk": 2, "miss": 6},
                "tokens": {"resident": 5400, "ram": 2100, "disk": 900},
                "restore_seconds": 0.08, "saved_seconds": 11.5},
        "restore_bytes_per_s": 9.5e9, "disk_bytes_per_s": 1.2e9,
        "ram": {"bytes": 700, "bound": 1024, "entries": 14, "peak": 900},
        "disk": {"bytes": 3000, "entries": 40, "bound": 20000, "enabled": True},
        "saved": 60, "spilled": 40, "dropped": 1, "conversations": ["ab12"],
    }  # fmt: skip
    snapshot["models"]["m"]["speculation"] = {
        "enabled": True, "mode": "auto", "drafted": 48, "accepted": 47, "drafts": 6,
        "verify_tokens": 48, "acceptance": 47 / 48, "table_contexts": 3,
    }  # fmt: skip
    return snapshot


def test_each_tier_of_kept_prompts_is_exported_against_its_bound():
    found = parsed([warm_snapshot()])

    def tier(name: str, value: str) -> float:
        return found[(name, (("model", "m"), ("tier", value), ("worker", "box-1")))]

    assert tier("appliance_prompt_cache_bytes", "ram") == 700
    assert tier("appliance_prompt_cache_bound_bytes", "ram") == 1024
    assert tier("appliance_prompt_cache_entries", "ram") == 14
    assert tier("appliance_prompt_cache_bytes", "disk") == 3000
    assert tier("appliance_prompt_cache_bound_bytes", "disk") == 20000
    assert tier("appliance_prompt_cache_entries", "disk") == 40
    admissions = "appliance_prompt_cache_admissions_total"
    assert [tier(admissions, t) for t in ("resident", "ram", "disk", "miss")] == [12, 5, 2, 6]
    reused = "appliance_prompt_cache_reused_tokens_total"
    assert [tier(reused, t) for t in ("resident", "ram", "disk")] == [5400, 2100, 900]
    model = (("model", "m"), ("worker", "box-1"))
    assert found[("appliance_prompt_cache_saved_seconds_total", model)] == 11.5
    assert found[("appliance_prompt_cache_restore_seconds_total", model)] == 0.08
    # Bounded labels: the tiers and miss, never a conversation, a key or a person.
    tiers = {dict(labels).get("tier") for _, labels in found} - {None}
    assert tiers == {"resident", "ram", "disk", "miss"}
    assert not [key for key in found if "ab12" in str(key)]


def test_speculation_counters_are_named_as_vllm_names_them():
    found = parsed([warm_snapshot()])
    model = (("model", "m"), ("worker", "box-1"))
    assert found[("appliance_spec_decode_num_draft_tokens_total", model)] == 48
    assert found[("appliance_spec_decode_num_accepted_tokens_total", model)] == 47
    assert found[("appliance_spec_decode_num_drafts_total", model)] == 6


def test_without_warm_memory_only_the_resident_reuse_is_exported():
    snapshot = warm_snapshot()
    cache = snapshot["models"]["m"]["prompt_cache"]
    snapshot["models"]["m"]["prompt_cache"] = {"enabled": False, "use": cache["use"]}
    ram_only = warm_snapshot()
    ram_only["models"]["m"]["prompt_cache"]["disk"]["enabled"] = False
    found, in_ram = parsed([snapshot]), parsed([ram_only])
    assert not [key for key in found if key[0].startswith("appliance_prompt_cache_bytes")]
    admissions = ("model", "m"), ("tier", "resident"), ("worker", "box-1")
    assert found[("appliance_prompt_cache_admissions_total", admissions)] == 12
    tiers = {dict(labels)["tier"] for name, labels in in_ram
             if name == "appliance_prompt_cache_bytes"}  # fmt: skip
    assert tiers == {"ram"}


def test_an_engine_from_before_warm_memory_and_junk_give_no_series_and_no_error():
    assert not [key for key in parsed([snapshot_with_gpus()]) if "prompt_cache" in key[0]
                or "spec_decode" in key[0]]  # fmt: skip
    snapshot = warm_snapshot()
    engine = snapshot["models"]["m"]
    engine["prompt_cache"]["ram"] = {"bytes": "lots", "bound": float("nan"), "entries": -1}
    engine["prompt_cache"]["use"]["admitted"] = ["resident"]
    engine["speculation"] = {"drafted": True, "accepted": float("inf"), "drafts": 2}
    found = parsed([snapshot])
    assert not [key for key in found if key[0] == "appliance_prompt_cache_bytes"
                and dict(key[1])["tier"] == "ram"]  # fmt: skip
    assert not [key for key in found if key[0] == "appliance_prompt_cache_admissions_total"]
    model = (("model", "m"), ("worker", "box-1"))
    assert found[("appliance_spec_decode_num_drafts_total", model)] == 2
    assert ("appliance_spec_decode_num_draft_tokens_total", model) not in found


def test_reading_images_is_counted_per_model():
    # Two requests of the same picture on an engine with a (fake) projector: one encode, one
    # hit in the encoder cache, and the image positions of both prompts.
    engine = Engine(FakeVisionRunner(image_tokens=8), itl_target=0.1).start()
    try:
        frame = Image.from_bytes(picture(seed=7))
        for question in ("what is it?", "and now?"):
            request = GenerationRequest(MEDIA_MARKER + question, media=(frame,))
            assert engine.submit(request).result(timeout=10).type == "done"
        snapshot = engine.snapshot()
    finally:
        engine.shutdown()
    found = parsed([{"worker": "box-1", "loaded": [{"name": "m"}], "models": {"m": snapshot},
                     "system": {}}])  # fmt: skip
    model = (("model", "m"), ("worker", "box-1"))
    assert found[("appliance_images_encoded_total", model)] == 1
    assert found[("appliance_images_cached_total", model)] == 1
    assert found[("appliance_image_tokens_total", model)] == 16
    assert found[("appliance_image_encode_seconds_total", model)] >= 0


def test_every_family_exported_is_listed_in_the_docs():
    telemetry = Telemetry()
    telemetry.record_images(encoded=1, cached=0, seconds=0.1, tokens=64)
    snapshot = snapshot_with_gpus()
    snapshot["models"]["m"]["totals"] = telemetry.snapshot(1.0)["totals"]
    text = render(lambda: [snapshot]).decode()
    listed = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names
    # A counter family is named without _total; the docs give the series' name.
    missing = {n for n in names if f"`{n}`" not in listed and f"`{n}_total`" not in listed}
    assert not missing, f"docs/metrics.md does not list {sorted(missing)}"
