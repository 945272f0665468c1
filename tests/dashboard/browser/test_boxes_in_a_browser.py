"""The dashboard's Boxes panel in a real browser (Debian's chromium) against a live embedded
appliance: one box, this one, with its host, its models by name (on disk, then loaded with its
slots once an answer loaded it), its free RAM; at desktop and phone width."""

import shutil

import httpx
import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in
from tests.dashboard.browser.test_dashboard_in_a_browser import SHOTS

pytestmark = [pytest.mark.browser, pytest.mark.model]

ANSWER_TIMEOUT_S = 180


def shot(page, artifacts, name: str, locator=None) -> None:
    (locator or page).screenshot(path=str(artifacts / name))
    if SHOTS.parent.exists():  # the helpers' review folder, when there is one
        SHOTS.mkdir(exist_ok=True)
        shutil.copy(artifacts / name, SHOTS / name)


def test_the_boxes_panel_shows_this_box_and_its_models(browser, live_appliance, artifacts):
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_appliance, "admin", ADMIN_PASSWORD)
    page.goto(live_appliance.url + "/dashboard/")
    expect(page.locator("#live-state")).to_have_text("live", timeout=10_000)

    card = page.locator("#boxes .box")
    expect(card).to_have_count(1, timeout=10_000)
    expect(card.locator("h3")).to_have_text("embedded")
    expect(card.locator(".box-head .muted")).to_contain_text("on ")  # the host's name
    expect(card).to_contain_text("RAM free")
    starter = card.locator(".box-models li", has_text="smollm2")
    expect(starter).to_have_count(1)
    expect(page.locator("#boxes-summary")).to_have_text("one box: this one")

    # An answer loads the model: the box lists it as loaded, with its free slots.
    key = live_appliance.manage("create_api_key", "boxes-browser", "--scope", "chat").strip()
    headers = {"Authorization": f"Bearer {key}"}
    model = httpx.get(live_appliance.url + "/v1/models", headers=headers).json()["data"][0]["id"]
    answer = httpx.post(live_appliance.url + "/v1/chat/completions", headers=headers,
                        timeout=ANSWER_TIMEOUT_S, json={
                            "model": model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    loaded = card.locator(".box-models li.is-loaded")
    expect(loaded).to_have_count(1, timeout=10_000)
    expect(loaded.locator(".model-where")).to_contain_text("slots free")
    expect(card.locator(".box-state")).to_have_text("ready")
    shot(page, artifacts, "boxes-desktop.png", page.locator(".boxes-card"))
    assert errors == []
    page.close()

    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    log_in(phone, live_appliance, "admin", ADMIN_PASSWORD)
    phone.goto(live_appliance.url + "/dashboard/")
    expect(phone.locator("#boxes .box")).to_have_count(1, timeout=10_000)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 391
    box = phone.locator("#boxes .box").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390  # the card fits the phone
    shot(phone, artifacts, "boxes-phone.png", phone.locator(".boxes-card"))
    phone.close()
