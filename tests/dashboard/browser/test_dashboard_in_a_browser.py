"""The dashboard's "now" in a real browser (Debian's chromium) against a live appliance: the
window picker drives the numbers, the step panel shows a long prompt spread over steps beside a
running stream, the tiles fall to 0 when everything has ended, and the timeline explains a row."""

import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in
from tests.live import LiveAppliance

pytestmark = [pytest.mark.browser, pytest.mark.model]

ANSWER_TIMEOUT_MS = 180_000
SHOTS = Path("/tmp/helpers/shots")
LONG_PROMPT = (
    "Here is my inventory, one line per shelf:\n"
    + "\n".join(
        f"shelf {i}: three jars of screws, a box of nails and a spare hinge" for i in range(24)
    )
    + "\nWhich shelf has the hinges?"
)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    """An appliance of this module's own, with a 1 s ITL target: on a small shared test box a
    step of one decode token alone can take most of 100 ms, which would leave a long prompt one
    token per step; the composition to watch is the same at any target."""
    appliance = LiveAppliance(
        tmp_path_factory.mktemp("appliance-dashboard"),
        ADMIN_PASSWORD=ADMIN_PASSWORD, TELEMETRY_INTERVAL_S="0.25", ITL_TARGET_MS="1000",
    )  # fmt: skip
    appliance.manage("migrate", "--verbosity", "0")
    appliance.manage("bootstrap")
    appliance.shell("from inference.models import LLMModel; LLMModel.objects.update(n_threads=2)")
    appliance.start()
    try:
        yield appliance
    finally:
        appliance.stop()


def shot(page, artifacts: Path, name: str) -> None:
    page.screenshot(path=str(artifacts / name), full_page=True)
    if SHOTS.parent.exists():  # the helpers' review folder, when there is one
        SHOTS.mkdir(exist_ok=True)
        shutil.copy(artifacts / name, SHOTS / name)


def api_call(url: str, key: str, model: str, content: str, max_tokens: int, results: list) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, timeout=600) as client:
        r = client.post("/v1/chat/completions", json=body, headers=headers)
        results.append((r.status_code, r.json()))


def test_the_dashboard_shows_now_over_the_chosen_window(browser, appliance, artifacts):
    key = appliance.manage("create_api_key", "dashboard-browser", "--scope", "chat").strip()
    models = httpx.get(appliance.url + "/v1/models",
                       headers={"Authorization": f"Bearer {key}"}).json()["data"]  # fmt: skip
    model = models[0]["id"]

    page = browser.new_page(viewport={"width": 1366, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, appliance, "admin", ADMIN_PASSWORD)
    page.goto(appliance.url + "/dashboard/")
    expect(page.locator("#live-state")).to_have_text("live", timeout=10_000)

    # 1. A short answer first (it loads the model), then a stream that writes until told to
    #    stop, and a long prompt read beside it.
    first = []
    api_call(appliance.url, key, model, "Say hello.", 4, first)
    assert first[0][0] == 200, first
    chat = browser.new_page(viewport={"width": 1000, "height": 800})
    log_in(chat, appliance, "admin", ADMIN_PASSWORD)
    chat.fill("#prompt", "Write a long story about a lighthouse keeper and a cat.")
    chat.click("#send")
    expect(page.locator("#streams")).to_contain_text("writing", timeout=ANSWER_TIMEOUT_MS)
    expect(page.locator("#streams .live-tps").first).not_to_have_text("–", timeout=10_000)
    long = []
    reader = threading.Thread(target=api_call, args=(
        appliance.url, key, model, LONG_PROMPT, 8, long))  # fmt: skip
    reader.start()

    # 2. The step panel: steps that carried prompt tokens beside the stream's decode token.
    summary = page.locator("#steps-summary")
    expect(summary).to_have_text(re.compile(r"\(([1-9]\d*) beside a stream\)"),
                                 timeout=ANSWER_TIMEOUT_MS)  # fmt: skip
    expect(page.locator("#streams")).to_contain_text("reading the prompt")
    page.wait_for_timeout(1500)  # a few more steps for the picture
    box = page.locator("#c-steps .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + box["height"] / 2)
    expect(page.locator("#steps-readout")).to_contain_text("ago:")
    # The engine's own record of each step: its target, what was predicted, the budget used.
    expect(page.locator("#steps-readout")).to_contain_text("predicted")
    expect(summary).to_contain_text(re.compile(r"the steps used \d+ % of their own target"))
    shot(page, artifacts, "dashboard-steps-prefill.png")
    assert errors == []
    # The writer is stopped in the chat; the prompt's rest is then read at full batch.
    chat.click("#stop")
    expect(chat.locator("#send")).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    chat.close()
    reader.join(ANSWER_TIMEOUT_MS / 1000)
    assert long and long[0][0] == 200, long

    # 3. The window picker changes what every tile and chart covers.
    def reading() -> dict:
        return {name: page.locator(f"#{name}").inner_text()
                for name in ("t-prompt-tail", "t-output-tail", "t-ttft-tail", "t-itl-tail",
                             "charts-note")}  # fmt: skip

    page.click(".window-picker button[data-window='30']")
    expect(page.locator(".window-picker button[data-window='30']")).to_have_attribute(
        "aria-pressed", "true")  # fmt: skip
    page.wait_for_timeout(800)
    short = reading()
    page.click(".window-picker button[data-window='3600']")
    expect(page.locator("#charts-note")).to_contain_text("2 min")
    page.wait_for_timeout(800)
    hour = reading()
    assert "30 s" in short["t-ttft-tail"] and "1 h" in hour["t-ttft-tail"]
    avg = re.compile(r"([\d.]+) avg over")
    # Averaged over an hour instead of 30 s, the same tokens make a smaller number.
    short_avg = float(avg.search(short["t-prompt-tail"]).group(1))
    hour_avg = float(avg.search(hour["t-prompt-tail"]).group(1))
    assert short_avg > hour_avg > 0
    assert re.search(r"p50\s*\d", page.locator("#t-ttft").inner_text(), re.I)  # labelled
    assert page.evaluate("localStorage.getItem('dashboard.window')") == "3600"

    # 4. When everything has ended, "now" reads 0 (not the last rate) and no stream is listed.
    expect(page.locator("#t-output-tps")).to_have_text("0.0", timeout=20_000)
    expect(page.locator("#t-prompt-tps")).to_have_text("0.0")
    expect(page.locator("#streams")).to_contain_text("Nothing is running")

    # 5. The timeline, newest first, explains a row in words; outcomes are plain words.
    page.click(".window-picker button[data-window='300']")
    expect(page.locator("#timeline .lane[tabindex]").first).to_be_visible(timeout=20_000)
    long_row = page.locator("#timeline .lane[tabindex]", has_text=re.compile(r"[1-9]\d\d in →"))
    long_row.hover()
    tip = page.locator("#timeline-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(re.compile(r"\d+-token prompt.*read in \d+ chunks while 1 stream "
                                           r"kept writing; answered \d+ tokens?"))  # fmt: skip
    outcomes = page.locator("#requests td.outcome").all_inner_texts()
    assert len(outcomes) == 3
    assert set(outcomes) & {"finished", "hit the length limit"}
    assert "stopped by the user" in outcomes  # the chat answer stopped with its Stop button
    assert not set(outcomes) & {"stop", "length", "cancelled"}
    expect(page.locator("#timeline .axis .tick").first).to_be_visible()
    shot(page, artifacts, "dashboard-light.png")

    page.emulate_media(color_scheme="dark")
    page.wait_for_timeout(600)
    shot(page, artifacts, "dashboard-dark.png")
    page.close()

    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    log_in(phone, appliance, "admin", ADMIN_PASSWORD)
    phone.goto(appliance.url + "/dashboard/")
    expect(phone.locator("#live-state")).to_have_text("live", timeout=10_000)
    phone.wait_for_timeout(1000)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 391
    shot(phone, artifacts, "dashboard-phone.png")
    phone.screenshot(path=str(artifacts / "dashboard-phone-top.png"))  # what a phone shows first
    phone.locator(".steps-card").screenshot(path=str(artifacts / "dashboard-phone-steps.png"))
    for name in ("dashboard-phone-top.png", "dashboard-phone-steps.png"):
        if SHOTS.exists():
            shutil.copy(artifacts / name, SHOTS / name)
    phone.close()
    assert errors == []
