"""The machine panel in a real browser (Debian's chromium), fed frames cut by the real panels()
from worker snapshots of a box with a card and of one without (a fake NVML with recorded cards):
the card's load, the runner's GPU memory beside llama.cpp's split of it, and "no GPU" instead of
zeros."""

import json

import pytest
from playwright.sync_api import expect

from dashboard.web.panels import panels
from tests.dashboard.browser.test_dashboard_apps_in_a_browser import FedDashboard, shot
from tests.dashboard.gpu_snapshots import RUNNER, worker_snapshot
from tests.inference.planning.nvml import MiB, h200

pytestmark = pytest.mark.browser


def frame(snapshot: dict) -> str:
    result = panels(snapshot)
    return json.dumps({"type": "snapshot", "panels": result}, allow_nan=False)


def test_the_machine_panel_shows_the_card_and_the_runner_or_says_no_gpu(
    browser, live_appliance, artifacts, monkeypatch
):
    card = h200(used_bytes=5000 * MiB, processes={RUNNER: 4700 * MiB}, utilization=64,
                temperature_c=48, power_mw=310_000)  # fmt: skip
    with_card = frame(worker_snapshot(monkeypatch, card, worker="embedded"))
    without = frame(worker_snapshot(monkeypatch, cuda=False, worker="embedded"))

    dash = FedDashboard(browser, live_appliance, {"width": 1366, "height": 900})
    page = dash.page
    dash.feed(with_card)
    machine = page.locator("#machine")
    expect(page.locator("#memory-title")).to_have_text("GPU memory (NVML)")
    expect(machine).to_contain_text("llama.cpp built for a GPU (layers offloaded)")
    expect(machine).to_contain_text("GPU 0 · NVIDIA H200: 64% busy · 48 °C · 310 W of 700 W")
    row = machine.locator("tbody tr")
    expect(row).to_have_count(1)
    assert row.locator("td").all_inner_texts() == [
        f"smollm2-1.7b · pid {RUNNER}", "4.6 GiB", "888 MiB", "3.0 GiB", "304 MiB", "25 of 25"]
    shot(page.locator("section.memory"), artifacts, "dashboard-machine-gpu.png")

    dash.feed(without)
    expect(machine).to_have_text("no GPU · llama.cpp built for the CPU only")
    expect(page.locator("#memory-title")).to_contain_text("no GPU")
    shot(page.locator("section.memory"), artifacts, "dashboard-machine-no-gpu.png")
    assert dash.errors == []
    page.close()
