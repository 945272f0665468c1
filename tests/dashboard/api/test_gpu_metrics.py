"""/metrics' GPU figures from a worker on a box with a card (fake NVML, recorded cards): each
card's load, the runner's GPU memory (NVML) and llama.cpp's split of it; nothing but
`appliance_gpus 0` on a box without one."""

from prometheus_client.parser import text_string_to_metric_families

from dashboard.api.metrics import render
from tests.dashboard.gpu_snapshots import MODEL, RUNNER, worker_snapshot
from tests.inference.planning.nvml import MiB, h200, laptop_4gb


def samples(snapshots: list[dict]) -> dict:
    text = render(lambda: snapshots).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_card_and_the_runner_on_it_are_exported_with_bounded_labels(monkeypatch):
    card = h200(processes={RUNNER: 4700 * MiB}, utilization=64, temperature_c=48,
                power_mw=310_000)  # fmt: skip
    found = samples([worker_snapshot(monkeypatch, card)])
    gpu = (("gpu", "0"), ("worker", "nas"))
    assert found[("appliance_gpus", (("worker", "nas"),))] == 1
    assert found[("appliance_gpu_utilization_ratio", gpu)] == 0.64
    assert found[("appliance_gpu_temperature_celsius", gpu)] == 48
    assert found[("appliance_gpu_power_watts", gpu)] == 310
    assert found[("appliance_gpu_power_limit_watts", gpu)] == 700
    runner = (("gpu", "0"), ("model", MODEL), ("worker", "nas"))
    assert found[("appliance_runner_gpu_memory_bytes", runner)] == 4700 * MiB
    part = lambda name: (("model", MODEL), ("part", name), ("worker", "nas"))  # noqa: E731
    assert found[("appliance_runner_gpu_buffer_bytes", part("kv"))] == 3072 * MiB
    assert found[("appliance_runner_gpu_buffer_bytes", part("compute"))] == 304 * MiB
    assert found[("appliance_runner_gpu_layers", (("model", MODEL), ("worker", "nas")))] == 25


def test_a_box_without_a_gpu_exports_no_gpu_series_but_the_count(monkeypatch):
    found = samples([worker_snapshot(monkeypatch, cuda=False)])
    assert found[("appliance_gpus", (("worker", "nas"),))] == 0
    gpu_series = [name for name, _ in found if "gpu" in name and name != "appliance_gpus"]
    assert gpu_series == []


def test_readings_a_card_does_not_give_are_left_out_rather_than_zero(monkeypatch):
    found = samples([worker_snapshot(monkeypatch, laptop_4gb(processes={RUNNER: None}))])
    names = {name for name, _ in found}
    assert "appliance_gpu_power_watts" not in names
    assert "appliance_runner_gpu_memory_bytes" not in names
    assert "appliance_gpu_temperature_celsius" in names
