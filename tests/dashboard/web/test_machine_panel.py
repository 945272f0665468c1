"""The dashboard's machine panel: which llama.cpp the runners use, each card's load, and each
runner's GPU memory as NVML counts it beside llama.cpp's own split; a box without a GPU says
"no GPU" instead of showing zeros. Snapshots from a fake NVML with recorded cards."""

import json

from dashboard.web.panels import panels
from tests.dashboard.gpu_snapshots import MODEL, RUNNER, worker_snapshot
from tests.inference.planning.nvml import MiB, h200, laptop_4gb


def test_a_runner_on_a_card_shows_its_nvml_memory_beside_weights_kv_and_compute(monkeypatch):
    card = h200(used_bytes=5000 * MiB, processes={RUNNER: 4700 * MiB, 99: 300 * MiB},
                utilization=64, temperature_c=48, power_mw=310_000)  # fmt: skip
    result = panels(worker_snapshot(monkeypatch, card))
    json.dumps(result, allow_nan=False)
    machine = result["machine"]
    assert machine["gpu"] is True and machine["build"] == "gpu"
    assert machine["cards"] == [{"index": 0, "name": "NVIDIA H200", "utilization": 64.0,
                                 "temperature_c": 48.0, "power_w": 310.0,
                                 "power_limit_w": 700.0}]  # fmt: skip
    (runner,) = machine["runners"]
    assert (runner["model"], runner["pid"], runner["nvml_bytes"]) == (MODEL, RUNNER, 4700 * MiB)
    assert runner["weights_bytes"] == round(888.05 * MiB)
    assert (runner["kv_bytes"], runner["compute_bytes"]) == (3072 * MiB, 304 * MiB)
    assert (runner["gpu_layers"], runner["layers"]) == (25, 25)


def test_a_box_without_a_gpu_says_so_and_has_no_gpu_figures(monkeypatch):
    machine = panels(worker_snapshot(monkeypatch, cuda=False))["machine"]
    assert machine == {"gpu": False, "build": "cpu", "cards": [], "runners": []}


def test_figures_a_card_does_not_report_are_none_not_zero(monkeypatch):
    card = laptop_4gb(processes={RUNNER: None}, temperature_c=None)
    machine = panels(worker_snapshot(monkeypatch, card))["machine"]
    (shown,) = machine["cards"]
    assert shown["power_w"] is None and shown["temperature_c"] is None
    assert machine["runners"][0]["nvml_bytes"] is None


def test_a_cpu_build_on_a_box_with_a_card_reports_no_gpu_split(monkeypatch):
    machine = panels(worker_snapshot(monkeypatch, h200(), cuda=False))["machine"]
    assert machine["build"] == "cpu"
    (runner,) = machine["runners"]
    assert runner["weights_bytes"] is None and runner["kv_bytes"] is None


def test_before_any_model_loads_the_build_is_unknown():
    assert panels({"system": {"gpus": []}})["machine"]["build"] is None


def test_the_page_has_a_place_for_the_machine_panel(admin_client):
    page = admin_client.get("/dashboard/").content.decode()
    assert 'id="machine"' in page
