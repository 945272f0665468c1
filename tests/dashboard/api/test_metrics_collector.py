"""The /metrics collector on a worker snapshot with GPUs (this box has none, so the live tests
cannot see the GPU series): every reading becomes its series, labelled by worker and GPU."""

from prometheus_client.parser import text_string_to_metric_families

from dashboard.api.metrics import render
from inference.engine.telemetry import Telemetry


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
    assert found[("appliance_time_to_first_token_seconds_count", model)] == 1
    assert found[("appliance_time_to_first_token_seconds_sum", model)] == 0.2
    assert found[("appliance_time_to_first_token_seconds_bucket", (("le", "0.2"), *model))] == 1
    assert found[("appliance_time_to_first_token_seconds_bucket", (("le", "0.15"), *model))] == 0
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
