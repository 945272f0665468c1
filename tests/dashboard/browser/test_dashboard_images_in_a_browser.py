"""Reading pictures on the dashboard, in a real browser (Debian's chromium): the step panel's
image tokens (a part of a step's prompt tokens) and the band over the steps that ended while the
encoder was busy, the model's encoder on its box and in the prompt tile, and a request's encode
phase on the timeline; at desktop and phone width.

The page is fed its socket's frames by Playwright, cut by the real panels() and box_panel()
from a hand-made engine snapshot shaped as Engine.snapshot() gives it
(tests/dashboard/web/test_panels.py checks the columns); the request is saved in the history
as the pipeline saves it."""

import json
import time

import pytest
from playwright.sync_api import expect

from dashboard.web.boxes import box_panel
from dashboard.web.panels import panels
from tests.dashboard.browser.test_dashboard_apps_in_a_browser import STEPS, FedDashboard, shot

pytestmark = pytest.mark.browser

MODEL = "smollm2-135m-instruct"
PICTURE_AT = 40  # steps 36-39 ended while the encoder read the picture; 40-41 fed its 64 tokens


def engine(finished: int) -> dict:
    steps = {key: [] for key in ("ago", "decode", "prompt", "ms", "seqs", "image", "encoding")}
    for i in range(STEPS):
        image = 32 if i in (PICTURE_AT, PICTURE_AT + 1) else 0
        prompt = image + (12 if i == PICTURE_AT + 1 else 0)
        row = {"ago": round((STEPS - i) * 0.12, 2), "decode": 1, "prompt": prompt,
               "ms": 40.0 + prompt * 0.5, "seqs": 1 + (1 if prompt else 0), "image": image,
               "encoding": 1 if PICTURE_AT - 4 <= i < PICTURE_AT else 0}  # fmt: skip
        for key, value in row.items():
            steps[key].append(value)
    return {"prompt_tps": 380.0, "output_tps": 25.0, "queue_depth": 0, "active_sequences": 1,
            "prefilling": 0, "decoding": 1, "slots": 4, "kv_fill": 0.1, "itl_target": 0.1,
            "window_s": 10.0, "outcomes": {"stop": finished}, "streams": [], "steps": steps,
            "vision": {"encoding": 1, "requests": 1, "images_encoded": 3, "images_cached": 2,
                       "encode_seconds": 0.55, "failed": 0,
                       "cache": {"entries": 2, "bytes": 1, "capacity": 8, "hits": 2,
                                 "misses": 3}}}  # fmt: skip


def frame(finished: int) -> str:
    snapshot = {"worker": "embedded", "mode": "embedded", "time": 1000.0, "loading": None,
                "loaded": [{"name": MODEL, "size_bytes": 98_000_000, "busy": True}],
                "models": {MODEL: engine(finished)},
                "system": {"gpus": [], "rss_bytes": 900_000_000, "model_bytes": 98_000_000,
                           "ram_total_bytes": 16_000_000_000, "cpu_percent": 60.0,
                           "cpu_count": 2}}  # fmt: skip
    cut = panels(snapshot)
    cut["box"] = box_panel(cut, None, {}, [])
    return json.dumps({"type": "snapshot", "panels": cut}, allow_nan=False)


def save_a_request_with_a_picture(appliance) -> None:
    figures = {"prompt_tokens": 90, "cached_tokens": 0, "output_tokens": 12, "queue_time": 0.01,
               "load_time": 0.0, "prefill_time": 0.3, "ttft": 0.5, "total_time": 1.4,
               "encode_time": 0.18, "image_tokens": 64, "images_encoded": 1,
               "accepted_wall": time.time() - 3,
               "timeline": [{"phase": "encode", "start": 0.0, "end": 0.18, "tokens": 64},
                            {"phase": "queue", "start": 0.18, "end": 0.19},
                            {"phase": "prefill", "start": 0.19, "end": 0.49, "tokens": 90},
                            {"phase": "decode", "start": 0.5, "end": 1.4}]}  # fmt: skip
    appliance.shell(
        "from inference import history; history.record_request(request_id='pic',"
        f" model_name={MODEL!r}, source='chat', client='alice', figures={figures!r},"
        " outcome='stop')"
    )


DESKTOP, PHONE = {"width": 1366, "height": 900}, {"width": 390, "height": 844}


@pytest.mark.parametrize("size", [pytest.param(DESKTOP, id="desktop"),
                                  pytest.param(PHONE, id="phone")])  # fmt: skip
def test_the_dashboard_shows_image_tokens_the_encoder_and_the_encode_phase(
    browser, live_appliance, artifacts, size
):
    phone = size["width"] < 500
    save_a_request_with_a_picture(live_appliance)
    dash = FedDashboard(browser, live_appliance, size, is_mobile=phone)
    page = dash.page
    dash.feed(frame(25))
    dash.feed(frame(26), times=2)  # an answer ended: the page reads the request history

    # 1. The step panel: image tokens and the encoder's band, named in the legend and summary.
    expect(page.locator("#legend-image")).to_be_visible()
    expect(page.locator("#legend-encoding")).to_be_visible()
    expect(page.locator("#steps-summary")).to_contain_text("2 fed image tokens")
    expect(page.locator("#steps-summary")).to_contain_text("4 ended while the encoder read images")
    if not phone:  # the phone's chart has fewer slots than steps: hover positions differ
        assert "44 prompt tokens of a prompt being read (32 of them an image's)" in dash.hover_step(
            PICTURE_AT + 1)  # fmt: skip
        assert "the encoder was reading 1 image" in dash.hover_step(PICTURE_AT - 2)
        assert "encoder" not in dash.hover_step(10)

    # 2. The model's encoder, on its box and in the prompt tile.
    vision = page.locator(".box-models .model-vision")
    expect(vision).to_have_text("images 3 encoded · 2 from the cache · 550 ms encoding"
                                " · encoder busy (1 image)")  # fmt: skip
    tile = page.locator("#t-prompt-images")
    expect(tile).to_have_text("images 3 encoded · 2 cached · encoder busy")

    # 3. The timeline: the encode phase in its own colour, and in the row's words.
    # (The appliance is the session's: the other width's test saved such a request too.)
    expect(page.locator("#timeline .seg.ph-encode").first).to_be_visible()
    lane = page.locator("#timeline .lane", has=page.locator(".ph-encode")).first
    label = lane.get_attribute("aria-label")
    assert "read its images in 180 ms" in label and "(64 of them image tokens)" in label
    assert "encode 180 ms · queue 10 ms" in label
    name = "dashboard-images-" + ("phone" if phone else "desktop")
    dash.feed(frame(26), times=1)
    if not phone:
        dash.hover_step(PICTURE_AT + 1)
    shot(page, artifacts, name + ".png", full_page=True)
    for part, where in (("steps", ".steps-card"), ("boxes", ".boxes-card"), ("tiles", ".tiles")):
        dash.feed(frame(26), times=1)
        if part == "steps" and not phone:
            dash.hover_step(PICTURE_AT + 1)
        shot(page.locator(where), artifacts, f"{name}-{part}.png")
    shot(page.locator("#timeline").locator(".."), artifacts, name + "-requests.png")
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"] + 1
    assert dash.errors == []
    page.close()
