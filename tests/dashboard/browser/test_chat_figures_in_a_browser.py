"""A saved answer's figures on the chat page, in Debian's chromium: where its cached tokens
came from (a resident slot, RAM or disk, and what restoring them took) and what speculation
kept, each a chip that explains itself when tapped; at desktop and phone width. The answers are
saved in the database as the chat saves them (no model answers here)."""

import re
import shutil

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import log_in
from tests.dashboard.browser.test_chat_page import DESKTOP, PHONE, SHOTS

pytestmark = pytest.mark.browser
CACHED = re.compile(r"^cached")  # the chip, not the prompt and tokens chips that mention it

FIGURES = {
    "ttft": 0.41, "prompt_tps": 380.0, "decode_tps": 61.0, "prompt_tokens": 460,
    "cached_tokens": 430, "output_tokens": 50, "queue_time": 0.0, "load_time": 0.0,
    "prefill_time": 0.08, "total_time": 1.3, "finish_reason": "stop",
}  # fmt: skip
WARM = {**FIGURES, "cached_by_tier": {"resident": 0, "ram": 430, "disk": 0},
        "restore_time": 0.002, "drafted": 48, "draft_accepted": 47}  # fmt: skip
RESIDENT = {**FIGURES, "cached_by_tier": {"resident": 430, "ram": 0, "disk": 0},
            "restore_time": 0.0, "drafted": 0, "draft_accepted": 0}  # fmt: skip


def conversation_with(appliance, *answers: dict) -> int:
    """alice's conversation with one saved answer per figures dict, oldest first."""
    out = appliance.shell(
        "from django.contrib.auth.models import User; from dashboard.models import Conversation,"
        " Message; c = Conversation.objects.create(user=User.objects.get(username='alice'),"
        " title='warm answers');"
        f"[(Message.objects.create(conversation=c, role='user', content=f'Question {{i}}'),"
        f" Message.objects.create(conversation=c, role='assistant', model_name='smollm2',"
        f" content=f'Answer {{i}}.', figures=f)) for i, f in enumerate({list(answers)!r})];"
        "print('conversation', c.pk)"
    )
    return int(re.search(r"conversation (\d+)", out).group(1))


@pytest.mark.parametrize("size", [pytest.param(DESKTOP, id="desktop"),
                                  pytest.param(PHONE, id="phone")])  # fmt: skip
def test_an_answer_says_where_its_cached_tokens_came_from_and_what_speculation_kept(
    browser, live_appliance, size
):
    cid = conversation_with(live_appliance, FIGURES, RESIDENT, WARM)
    phone = size is PHONE
    context = browser.new_context(viewport=size, is_mobile=phone, has_touch=phone)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_appliance, "alice", "pw-alice-123")
    page.goto(f"{live_appliance.url}/c/{cid}/")
    answers = page.locator(".msg-assistant")
    expect(answers).to_have_count(3)

    # 1. Saved before warm memory: no chip for what it does not know.
    expect(answers.nth(0).locator(".chip")).to_have_count(4)
    # 2. Its conversation's slot still held the prompt: resident, nothing restored.
    expect(answers.nth(1).locator(".chip", has_text=CACHED)).to_have_text("cached 430 · resident")
    expect(answers.nth(1).locator(".chip", has_text="speculation")).to_have_count(0)
    # 3. Restored from RAM, and drafts kept.
    warm = answers.nth(2)
    cached = warm.locator(".chip", has_text=CACHED)
    expect(cached).to_have_text("cached 430 · RAM, restored in 2 ms")
    expect(warm.locator(".chip", has_text="speculation")).to_have_text(
        "speculation 48 drafted, 47 kept")  # fmt: skip
    cached.tap() if phone else cached.click()
    explain = warm.locator(".explain")
    expect(explain).to_contain_text("kept in RAM after an earlier turn left the model's memory")
    expect(explain).to_contain_text("restored in 2 ms")
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"] + 1
    name = "chat-figures-" + ("phone" if phone else "desktop")
    page.screenshot(path=f"/tmp/{name}.png")
    if SHOTS.parent.exists():  # the helpers' review folder, when there is one
        SHOTS.mkdir(exist_ok=True)
        shutil.copy(f"/tmp/{name}.png", SHOTS / f"{name}.png")
    speculation = warm.locator(".chip", has_text="speculation")
    speculation.tap() if phone else speculation.click()
    expect(explain).to_contain_text("the answer is the same")
    assert errors == []
    context.close()


PICTURE = {**FIGURES, "encode_time": 0.183, "image_tokens": 64, "images_encoded": 1,
           "images_cached": 0}  # fmt: skip


@pytest.mark.parametrize("size", [pytest.param(DESKTOP, id="desktop"),
                                  pytest.param(PHONE, id="phone")])  # fmt: skip
def test_an_answer_to_a_picture_says_what_encoding_it_took_and_a_text_answer_says_nothing(
    browser, live_appliance, size
):
    cid = conversation_with(live_appliance, FIGURES, PICTURE)
    phone = size is PHONE
    context = browser.new_context(viewport=size, is_mobile=phone, has_touch=phone)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_appliance, "alice", "pw-alice-123")
    page.goto(f"{live_appliance.url}/c/{cid}/")
    answers = page.locator(".msg-assistant")
    expect(answers).to_have_count(2)
    expect(answers.nth(0).locator(".chip", has_text="images")).to_have_count(0)
    chip = answers.nth(1).locator(".chip", has_text="images")
    expect(chip).to_have_text("images encode 183 ms · 64 image tokens")
    chip.tap() if phone else chip.click()
    expect(answers.nth(1).locator(".explain")).to_contain_text("1 encoded")
    assert page.evaluate("document.documentElement.scrollWidth") <= size["width"] + 1
    name = "chat-figures-images-" + ("phone" if phone else "desktop")
    page.screenshot(path=f"/tmp/{name}.png")
    assert errors == []
    context.close()
