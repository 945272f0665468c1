"""Who the engine is serving, in a real browser (Debian's chromium): the apps-and-people table,
the priority and app of each answer running, and the step panel's marks for background work.

The page is fed its socket's frames by Playwright (page.route_web_socket), cut by the real
panels() from hand-made engine snapshots: an engine with fair share, with a person chatting
while an app's batch runs in the background, and one from before it, which must show what the
page showed before. The names in the frame are what the consumer adds (tested on the socket
itself in tests/dashboard/test_consumers_telemetry.py)."""

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

from dashboard.web.panels import panels
from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in

pytestmark = pytest.mark.browser

SHOTS = Path("/tmp/helpers/shots")
STEPS = 60  # as many as the desktop chart has slots: step i is at (i + 0.5) / 60 of its width
PERSON_FROM = 36  # the steps before it carried background work alone
APPS = {
    "apikey:1": "paperless",
    "apikey:2:user:7f3a": "open-webui · user 7f3a",
    "apikey:3": "home-assistant",
    "user:1": "admin",
}


def stream(id_, share, priority, *, phase="decoding", paused=False, output=40) -> dict:
    decoding = phase == "decoding"
    return {"id": id_, "share": share, "priority": priority, "paused": paused, "phase": phase,
            "prompt_tokens": 600, "cached_tokens": 0, "computed": 600 if decoding else 128,
            "output_tokens": output if decoding else 0, "max_tokens": 512,
            "tps": 6.5 if decoding and not paused else 0.0,
            "last_token_ago": 3.2 if paused else 0.08, "age": 30.0}  # fmt: skip


def engine_with_fair_share() -> dict:
    """An app floods the box with background work; a person and an Open WebUI user chat."""
    steps = {key: [] for key in ("ago", "decode", "prompt", "ms", "seqs", "background",
                                 "interactive", "paused")}  # fmt: skip
    for i in range(STEPS):
        person = i >= PERSON_FROM
        background = 8 if not person else 6
        decode = background + (2 if person else 0)
        prompt = 0 if i % 6 else (48 if person else 512)
        row = {"ago": round((STEPS - i) * 0.35, 2), "decode": decode, "prompt": prompt,
               "ms": 60.0 + prompt * 0.1 if person else 180.0 + prompt * 1.2,
               "seqs": decode + (1 if prompt else 0), "background": background,
               "interactive": 1 if person else 0, "paused": 2 if person else 0}  # fmt: skip
        for key, value in row.items():
            steps[key].append(value)
    return {
        "prompt_tps": 210.0, "output_tps": 48.0, "queue_depth": 5, "active_sequences": 10,
        "prefilling": 1, "decoding": 9, "slots": 12, "kv_fill": 0.62, "itl_target": 0.1,
        "window_s": 10.0, "outcomes": {"stop": 40},
        "streams": [
            stream("c0ffee01", "user:1", "interactive", output=12),
            stream("c0ffee02", "apikey:2:user:7f3a", "interactive", output=80),
            stream("ba7c0001", "apikey:1", "background", output=310),
            stream("ba7c0002", "apikey:1", "background", paused=True, output=122),
            stream("ba7c0003", "apikey:1", "background", phase="prefilling"),
        ],
        "shares": [
            {"share": "apikey:1", "priority": "background", "running": 8, "waiting": 4,
             "paused": 2, "tokens_recent": 5200},
            {"share": "apikey:2:user:7f3a", "priority": "interactive", "running": 1,
             "waiting": 0, "paused": 0, "tokens_recent": 380},
            {"share": "user:1", "priority": "interactive", "running": 1, "waiting": 0,
             "paused": 0, "tokens_recent": 420},
            {"share": "apikey:3", "priority": "interactive", "running": 0, "waiting": 1,
             "paused": 0, "tokens_recent": 0},
        ],
        "steps": steps,
    }  # fmt: skip


def engine_from_before() -> dict:
    """The same engine as an older version reports it: no shares, no priority step columns,
    streams without share or pause (they had a priority already)."""
    engine = engine_with_fair_share()
    del engine["shares"]
    for key in ("background", "interactive", "paused"):
        del engine["steps"][key]
    for row in engine["streams"]:
        del row["share"], row["paused"]
    return engine


def frame(engine: dict, apps: dict) -> str:
    snapshot = {"worker": "embedded", "mode": "embedded", "time": 1000.0, "loading": None,
                "loaded": [{"name": "smollm2-135m-instruct", "size_bytes": 98_000_000,
                            "busy": True}],
                "models": {"smollm2-135m-instruct": engine},
                "system": {"gpus": [], "rss_bytes": 900_000_000, "model_bytes": 98_000_000,
                           "ram_total_bytes": 16_000_000_000, "cpu_percent": 97.0,
                           "cpu_count": 2}}  # fmt: skip
    result = panels(snapshot)
    result["apps"] = apps
    return json.dumps({"type": "snapshot", "panels": result}, allow_nan=False)


class FedDashboard:
    """The dashboard page with its telemetry socket answered here, not by the server."""

    def __init__(self, browser, appliance, viewport: dict, **options):
        self.sockets = []
        self.page = browser.new_page(viewport=viewport, **options)
        self.errors = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.route_web_socket("**/ws/telemetry/", lambda ws: self.sockets.append(ws))
        log_in(self.page, appliance, "admin", ADMIN_PASSWORD)
        self.page.goto(appliance.url + "/dashboard/")
        expect(self.page.locator("#live-state")).to_have_text("live", timeout=10_000)

    def feed(self, message: str, times: int = 4) -> None:
        """A few frames, as the server sends them a few times a second (a worker silent for
        5 s is dropped by the page)."""
        for _ in range(times):
            self.sockets[-1].send(message)
            self.page.wait_for_timeout(300)

    def hover_step(self, index: int) -> str:
        box = self.page.locator("#c-steps .u-over").bounding_box()
        self.page.mouse.move(box["x"] + (index + 0.5) * box["width"] / STEPS, box["y"] + 20)
        return self.page.locator("#steps-readout").inner_text()


def shot(target, artifacts: Path, name: str, **options) -> None:
    target.screenshot(path=str(artifacts / name), **options)
    if SHOTS.parent.exists():  # the helpers' review folder, when there is one
        SHOTS.mkdir(exist_ok=True)
        shutil.copy(artifacts / name, SHOTS / name)


def test_the_dashboard_shows_each_app_and_priority_and_marks_background_steps(
    browser, live_appliance, artifacts
):
    dash = FedDashboard(browser, live_appliance, {"width": 1366, "height": 900})
    page = dash.page
    dash.feed(frame(engine_with_fair_share(), APPS))

    # 1. Apps and people: one row per app at each priority, by name, with its share of tokens.
    card = page.locator("#shares-card")
    expect(card).to_be_visible()
    rows = page.locator("#shares tr")
    expect(rows).to_have_count(4)
    table = [row.locator("td").all_inner_texts() for row in rows.all()]
    by_name = {cells[0]: cells for cells in table}
    assert set(by_name) == {"admin", "home-assistant", "open-webui · user 7f3a", "paperless"}
    # app · priority · share of the tokens · running · waiting · paused · tokens
    assert by_name["paperless"][1:] == ["background", "87%", "8", "4", "2", "5200"]  # of 6000
    assert by_name["admin"][1:4] == ["interactive", "7%", "1"]
    assert by_name["home-assistant"][2:5] == ["0%", "0", "1"]
    expect(page.locator("#shares-tokens-head")).to_have_text("tokens, last 10 s")
    expect(page.locator("#shares-summary")).to_contain_text("10 running · 5 waiting · 2 paused")

    # 2. Now answering names the app and the priority, and says which one is paused.
    streams = page.locator("#streams")
    expect(streams.locator("tr")).to_have_count(5)
    paused = streams.locator("tr.paused")
    expect(paused).to_have_count(1)
    expect(paused).to_contain_text("paperless")
    expect(paused).to_contain_text("background")
    expect(paused).to_contain_text("paused while writing")
    expect(paused.locator(".live-tps")).not_to_have_class("stalled")  # paused, not stalled
    person = streams.locator("tr", has_text="c0ffee01")
    expect(person).to_contain_text("admin")
    expect(person).to_contain_text("interactive")
    expect(streams.locator("tr", has_text="c0ffee02")).to_contain_text("open-webui · user 7f3a")

    # 3. The step panel: background tokens in their own colour, steps without an interactive
    #    stream marked (the target did not bind there), paused requests in the hover sentence.
    expect(page.locator("#legend-background")).to_be_visible()
    expect(page.locator("#legend-unbound")).to_be_visible()
    expect(page.locator("#note-unbound")).to_be_visible()
    expect(page.locator("#steps-summary")).to_contain_text(
        f"100% within the target (of the {STEPS - PERSON_FROM} steps it bound; "
        f"{PERSON_FROM} without an interactive stream) · up to 2 requests paused"
    )
    alone = dash.hover_step(PERSON_FROM - 3)
    assert "8 of them background" in alone and "the ITL target did not bind" in alone
    beside = dash.hover_step(STEPS - 2)
    assert "6 of them background" in beside and "within the 100 ms ITL target" in beside
    assert "2 requests paused" in beside
    # Screenshots take seconds on a small box: a frame before each, or the page drops the worker.
    fed = frame(engine_with_fair_share(), APPS)
    shot(page, artifacts, "dashboard-apps-light.png", full_page=True)
    dash.feed(fed, times=1)
    dash.hover_step(STEPS - 2)
    shot(page.locator(".steps-card"), artifacts, "dashboard-apps-steps-light.png")
    dash.feed(fed, times=1)
    shot(card, artifacts, "dashboard-apps-table-light.png")

    page.emulate_media(color_scheme="dark")
    dash.feed(fed, times=2)
    dash.hover_step(PERSON_FROM - 1)
    shot(page.locator(".steps-card"), artifacts, "dashboard-apps-steps-dark.png")
    dash.feed(fed, times=1)
    shot(card, artifacts, "dashboard-apps-table-dark.png")

    # The flood alone: no step was held to the target, and the summary says so, not "0 %".
    flood = engine_with_fair_share()
    flood["steps"]["interactive"] = [0] * STEPS
    dash.feed(frame(flood, APPS), times=2)
    expect(page.locator("#steps-summary")).to_contain_text(
        "no interactive stream in any of them: the target did not bind")
    assert dash.errors == []
    page.close()

    phone = FedDashboard(browser, live_appliance, {"width": 390, "height": 844}, is_mobile=True)
    phone.feed(fed)
    expect(phone.page.locator("#shares tr")).to_have_count(4)
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 391
    shot(phone.page, artifacts, "dashboard-apps-phone.png", full_page=True)
    phone.feed(fed, times=1)
    shot(phone.page.locator(".steps-card"), artifacts, "dashboard-apps-phone-steps.png")
    phone.page.emulate_media(color_scheme="dark")
    phone.feed(fed, times=2)
    shot(phone.page.locator("#shares-card"), artifacts, "dashboard-apps-phone-table-dark.png")
    assert phone.errors == []
    phone.page.close()


def test_an_engine_from_before_fair_share_shows_what_the_page_showed_before(
    browser, live_appliance, artifacts
):
    dash = FedDashboard(browser, live_appliance, {"width": 1366, "height": 900})
    page = dash.page
    dash.feed(frame(engine_from_before(), {}))
    expect(page.locator("#streams tr")).to_have_count(5)
    expect(page.locator("#shares-card")).to_be_hidden()
    expect(page.locator("#legend-background")).to_be_hidden()
    expect(page.locator("#legend-unbound")).to_be_hidden()
    expect(page.locator("#note-unbound")).to_be_hidden()
    expect(page.locator("#steps-summary")).to_contain_text("% within the target")
    expect(page.locator("#steps-summary")).not_to_contain_text("without an interactive stream")
    background = page.locator("#streams tr", has_text="ba7c0001").locator("td").all_inner_texts()
    assert background[1:4] == ["–", "background", "writing"]  # no app named, the priority kept
    readout = dash.hover_step(10)
    assert "did not bind" not in readout and "background" not in readout
    assert "paused" not in readout
    shot(page.locator(".steps-card"), artifacts, "dashboard-apps-old-engine.png")
    assert dash.errors == []
    page.close()
