"""The chat page as a household uses it, in Debian's chromium against a live appliance, on a
desktop (1366x900) and a phone (390x844): the fixed layout, the view following a stream, a
reload mid-answer, honest waiting, Continue, copy, edit and versions."""

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.model]

ANSWER_MS = 180_000
SHOTS = Path("/tmp/helpers/shots")
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
SIZES = [pytest.param(DESKTOP, id="desktop"), pytest.param(PHONE, id="phone")]
MODEL = "from inference.models import LLMModel; m = LLMModel.objects.get(is_default=True);"


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def _open(browser, appliance, size, *, dark=False):
    context = browser.new_context(
        viewport=size, is_mobile=size is PHONE, has_touch=size is PHONE,
        color_scheme="dark" if dark else "light",
    )  # fmt: skip
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    log_in(page, appliance, "alice", "pw-alice-123")
    return page


@pytest.fixture
def answers(live_appliance):
    """Set the starter model's answer settings for one test; the module's short answers after."""

    def use(**params):
        live_appliance.shell(f"{MODEL} m.default_params = {params!r}; m.save()")

    yield use
    use(max_tokens=48)


def _conversation(appliance, turns: int, *, words: int = 60) -> int:
    out = appliance.shell(
        "from django.contrib.auth.models import User; from dashboard.models import Conversation,"
        " Message; c = Conversation.objects.create(user=User.objects.get(username='alice'),"
        " title='a long talk');"
        f"[(Message.objects.create(conversation=c, role='user', content=f'Question {{i}}: ' +"
        f" 'how do I keep the garden watered? ' * 3), Message.objects.create(conversation=c,"
        f" role='assistant', model_name='smollm2', content=f'Answer {{i}}. ' + 'Water it early"
        f" in the morning. ' * {words // 6})) for i in range({turns})];"
        "print('conversation', c.pk)"
    )
    return int(re.search(r"conversation (\d+)", out).group(1))


def _in_view(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= size["height"]


def _at_bottom(page) -> bool:
    return page.evaluate(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight < 48; }"
    )


def _record_statuses(page) -> None:
    page.evaluate(
        "() => { window.__statuses = []; const s = document.getElementById('status');"
        " new MutationObserver(() => window.__statuses.push(s.textContent))"
        ".observe(s, {childList: true, characterData: true, subtree: true}); }"
    )


def _answer(page):
    return page.locator(".msg-assistant .msg-body").last


def _turns(page) -> int:
    return int(page.locator("#composer").get_attribute("data-turns") or 0)


def _stop_if_streaming(page) -> None:
    """Press Stop if the answer still streams; one that ended meanwhile needs none."""
    try:
        page.click("#stop", timeout=2_000)
    except PlaywrightTimeout:
        assert page.locator("#stop").is_hidden()


def _wait_done(page, turns: int):
    """Until the page has finished `turns` answers since it was loaded."""
    expect(page.locator("#composer")).to_have_attribute("data-turns", str(turns), timeout=ANSWER_MS)
    expect(page.locator("#send")).to_be_visible()


# --- layout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_the_composer_stays_in_view_after_a_long_conversation(browser, live_appliance, size):
    cid = _conversation(live_appliance, 12)
    for dark in (False, True):
        page = _open(browser, live_appliance, size, dark=dark)
        page.goto(f"{live_appliance.url}/c/{cid}/")
        expect(page.locator(".msg")).to_have_count(24)
        assert _in_view(page, "#prompt") and _in_view(page, "#send")
        # The page does not scroll; the message list does, and opens at its end.
        assert page.evaluate("document.documentElement.scrollHeight") <= size["height"] + 1
        assert page.evaluate("document.documentElement.scrollWidth") <= size["width"] + 1
        assert _at_bottom(page)
        name = "desktop" if size is DESKTOP else "phone"
        _shot(page, f"long-{name}{'-dark' if dark else ''}")
        # A figure explains itself on a tap (no hover-only tooltips).
        page.context.close()


@pytest.mark.parametrize("size", SIZES)
def test_the_view_follows_a_stream_until_the_reader_scrolls_up(
    browser, live_appliance, answers, size
):
    # Long enough that the answer still streams when Stop is pressed (about 10 s at the
    # starter's speed, speculation on or off): the test reads the view while it follows.
    answers(max_tokens=1000, temperature=0.8)
    cid = _conversation(live_appliance, 8)
    page = _open(browser, live_appliance, size)
    page.goto(f"{live_appliance.url}/c/{cid}/")
    page.fill("#prompt", "Write a long story about a lighthouse keeper.")
    page.click("#send")
    expect(page.locator("#stop")).to_be_visible(timeout=30_000)
    expect(_answer(page)).not_to_have_text("", timeout=ANSWER_MS)
    for _ in range(10):  # while it streams, the newest text stays in view
        page.wait_for_timeout(200)
        assert _at_bottom(page)
    assert _in_view(page, "#stop")
    # Scrolled up to read: the view stays there, and offers a way back.
    page.evaluate("document.getElementById('messages').scrollTop = 0")
    expect(page.locator("#jump")).to_be_visible(timeout=30_000)
    page.wait_for_timeout(600)
    assert page.evaluate("document.getElementById('messages').scrollTop") < 50
    _shot(page, f"following-{'desktop' if size is DESKTOP else 'phone'}")
    page.click("#jump")
    assert _at_bottom(page)
    expect(page.locator("#jump")).to_be_hidden()
    page.click("#stop")
    _wait_done(page, 1)
    assert page.errors == []
    page.context.close()


def test_a_figure_explains_itself_when_tapped(browser, live_appliance):
    page = _open(browser, live_appliance, PHONE)
    page.fill("#prompt", "Say hi.")
    page.click("#send")
    chip = page.locator(".msg-assistant .chip", has_text="decode").last
    expect(chip).to_be_visible(timeout=ANSWER_MS)
    chip.tap()
    explain = page.locator(".msg-assistant .explain").last
    expect(explain).to_be_visible()
    expect(explain).to_contain_text("Writing speed")
    expect(page.locator(".msg-assistant .model-name").last).not_to_have_text("")
    _shot(page, "figure-explained-phone")
    chip.tap()
    expect(explain).to_be_hidden()
    page.context.close()


# --- a reload mid-answer -----------------------------------------------------------------------


def test_a_reload_mid_answer_reattaches_and_the_answer_finishes(browser, live_appliance, answers):
    answers(max_tokens=70, temperature=0.8)
    page = _open(browser, live_appliance, DESKTOP)
    page.fill("#prompt", "Tell me a long story about a robot who learns to garden.")
    page.click("#send")
    expect(page.locator("#stop")).to_be_visible(timeout=30_000)
    page.wait_for_function(
        "() => { const b = [...document.querySelectorAll('.msg-assistant .msg-body')].pop();"
        " return b && b.textContent.length > 30; }", timeout=ANSWER_MS,
    )  # fmt: skip
    before = _answer(page).inner_text().strip()
    page.reload()
    # The same answer, picked up where it is now, still being written.
    expect(page.locator("#stop")).to_be_visible(timeout=10_000)
    expect(page.locator(".msg-assistant")).to_have_count(1)
    page.wait_for_function(
        "n => [...document.querySelectorAll('.msg-assistant .msg-body')].pop()"
        ".textContent.length > n",
        arg=len(before) + 10, timeout=ANSWER_MS,
    )  # fmt: skip
    _shot(page, "reattached-desktop")
    _wait_done(page, 1)
    after = _answer(page).inner_text().strip()
    assert after.startswith(before[:30]) and len(after) > len(before)
    expect(page.locator(".msg-assistant .figures").last).to_be_visible()
    assert page.locator(".note-stopped").count() == 0
    assert page.errors == []
    page.context.close()


# --- honest waiting ----------------------------------------------------------------------------


@pytest.fixture
def one_at_a_time(live_appliance):
    """The starter model reloaded with two sequences (parallel 2; finished turns go to the
    tiers of kept prompts, not to slots of their own), so a third request has to wait."""
    raw = live_appliance.manage("create_api_key", "browser-queue", "--scope", "manage").strip()
    key = raw.splitlines()[-1]
    name = live_appliance.shell(f"{MODEL} print('model', m.name)").split("model ")[-1].strip()

    def unload():
        body = {"model": name, "keep_alive": 0}
        auth = {"Authorization": f"Bearer {key}"}
        url = f"{live_appliance.url}/api/generate"
        for _ in range(120):  # a stopped answer may take a moment to leave the engine
            response = httpx.post(url, json=body, headers=auth, timeout=60)
            if response.status_code != 429:
                break
            time.sleep(1)
        assert response.status_code == 200, response.text

    live_appliance.shell(f"{MODEL} m.parallel = 2; m.save()")
    unload()
    yield
    live_appliance.shell(f"{MODEL} m.parallel = 4; m.save()")
    unload()


def _statuses_include(page, prefix: str) -> None:
    page.wait_for_function(
        "p => window.__statuses.some(s => s.startsWith(p))", arg=prefix, timeout=ANSWER_MS
    )


def test_loading_queue_position_and_prompt_progress_are_shown(
    browser, live_appliance, answers, one_at_a_time
):
    # Long answers, so both still stream when the third page asks (speculation makes prose
    # faster); they are stopped at the end.
    answers(max_tokens=1500, temperature=0.8)
    first = _open(browser, live_appliance, DESKTOP)
    third = _open(browser, live_appliance, DESKTOP)
    second = _open(browser, live_appliance, PHONE)
    pages = (first, second, third)
    for page in pages:
        _record_statuses(page)
    try:
        first.fill("#prompt", "Write a long poem about the sea.")
        first.click("#send")
        expect(_answer(first)).not_to_have_text("", timeout=ANSWER_MS)
        third.fill("#prompt", "Write a long story about a fox.")
        third.click("#send")
        expect(_answer(third)).not_to_have_text("", timeout=ANSWER_MS)
        # A long prompt while both sequences are busy: it waits, then is read in chunks.
        note = "The heating comes on at six and goes off at ten. "
        second.fill("#prompt", "Summarise these notes. " + note * 110)
        second.click("#send")
        _statuses_include(second, "Waiting: ")
        _shot(second, "waiting-phone")
        _stop_if_streaming(first)  # a poem that ended by itself frees its sequence as well
        _statuses_include(second, "Reading the prompt: ")
        _shot(second, "reading-phone")
    finally:
        for page in pages:
            _stop_if_streaming(page)
    for page in pages:
        _wait_done(page, 1)
    first_seen = first.evaluate("window.__statuses")
    seen = second.evaluate("window.__statuses")
    assert any(re.match(r"(Loading model…|Starting…)", s) for s in first_seen), first_seen
    assert any(re.match(r"Waiting: (\d+ ahead of you|you are next)", s) for s in seen), seen
    assert any(re.match(r"Reading the prompt: [\d,]+ / [\d,]+ tokens", s) for s in seen), seen
    for page in pages:
        assert page.errors == []
        page.context.close()


# --- Continue, copy, versions, edit ------------------------------------------------------------


def test_continue_copy_regenerate_versions_and_edit(browser, live_appliance, answers):
    answers(max_tokens=12, temperature=0.0)
    page = _open(browser, live_appliance, DESKTOP)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_appliance.url)
    page.fill("#prompt", "Write a long story about a dog.")
    page.click("#send")
    _wait_done(page, 1)
    expect(page.locator(".note-length")).to_be_visible()
    short = _answer(page).inner_text()

    # Continue: the same answer grows in place.
    page.click(".msg-assistant .continue")
    _wait_done(page, 2)
    expect(page.locator(".msg-assistant")).to_have_count(1)
    grown = _answer(page).inner_text()
    assert len(grown) > len(short) and grown.startswith(short.strip()[:10])

    # Copy: the answer's text lands on the clipboard.
    page.click(".msg-assistant .copy-answer")
    expect(page.locator(".msg-assistant .copy-answer")).to_have_attribute("data-copied", "true")
    clip = page.evaluate("navigator.clipboard.readText()")
    assert clip.strip()[:10] == grown.strip()[:10]

    # Regenerate keeps the old answer as a version to flip back to.
    page.click(".msg-assistant .regenerate")
    _wait_done(page, 3)
    versions = page.locator(".msg-assistant .versions")
    expect(versions).to_contain_text("2/2")
    page.click(".msg-assistant .version-prev")
    expect(versions).to_contain_text("1/2")
    assert _answer(page).inner_text() == grown
    page.click(".msg-assistant .version-next")
    expect(versions).to_contain_text("2/2")

    # Edit and resend: a new version of the question with its own answer.
    page.click(".msg-user .edit")
    page.fill(".msg-user .editor textarea", "Count from one to five.")
    page.click(".msg-user .editor button[type=submit]")
    _wait_done(page, 4)
    expect(page.locator(".msg-user .msg-body")).to_have_text("Count from one to five.")
    expect(page.locator(".msg-user .versions")).to_contain_text("2/2")
    page.click(".msg-user .version-prev")
    expect(page.locator(".msg-user .msg-body")).to_have_text("Write a long story about a dog.")
    _shot(page, "versions-desktop")
    # Rename, then find it by search.
    page.click("#rename")
    page.fill("#rename-input", "Counting practice")
    page.press("#rename-input", "Enter")
    expect(page.locator("#chat-title")).to_have_text("Counting practice")
    page.fill("#search", "counting")
    page.press("#search", "Enter")
    expect(page.locator("#conversation-list a")).to_have_text(["Counting practice"])
    assert page.errors == []
    page.context.close()


def test_a_message_over_the_limit_is_refused_whole_not_cut(browser, live_appliance):
    page = _open(browser, live_appliance, PHONE)
    limit = json.loads(page.locator("#chat-data").text_content())["max_content_chars"]
    page.evaluate(
        "n => { const p = document.getElementById('prompt'); p.value = 'x'.repeat(n);"
        " p.dispatchEvent(new Event('input')); }", limit + 5,
    )  # fmt: skip
    assert page.evaluate("document.getElementById('prompt').value.length") == limit + 5
    expect(page.locator("#counter")).to_contain_text("nothing was cut")
    expect(page.locator("#send")).to_be_disabled()
    _shot(page, "oversize-phone")
    page.fill("#prompt", "Hello there")
    expect(page.locator("#counter")).to_contain_text(re.compile(r"\d tokens"))
    expect(page.locator("#send")).to_be_enabled()
    page.context.close()


@pytest.mark.parametrize("size", SIZES)
def test_the_token_counter_counts_on_a_loaded_model_and_estimates_otherwise(
    browser, live_appliance, size
):
    name = "desktop" if size is DESKTOP else "phone"
    raw = live_appliance.manage("create_api_key", f"counter-{name}", "--scope", "manage").strip()
    auth = {"Authorization": f"Bearer {raw}"}
    model = httpx.get(f"{live_appliance.url}/v1/models", headers=auth).json()["data"][0]["id"]

    def keep_alive(value: int) -> None:  # an empty prompt loads (or with 0 unloads) the model
        body = {"model": model, "prompt": "", "keep_alive": value, "stream": False}
        httpx.post(f"{live_appliance.url}/api/generate", json=body, headers=auth, timeout=120)

    keep_alive(0)
    try:
        page = _open(browser, live_appliance, size)
        counter = page.locator("#counter")
        page.fill("#prompt", "How often should I water a fern?")
        # Not loaded: counting never loads it, so the estimate stays, marked and explained.
        expect(counter).to_have_attribute("title", re.compile("not loaded"))
        expect(counter).to_have_text(re.compile(r"^≈ \d+ / [\d,]+ tokens$"))
        _shot(page, f"counter-estimate-{name}")
        keep_alive(-1)
        page.fill("#prompt", "How often should I water a fern in winter?")
        expect(counter).to_have_attribute("title", re.compile("counted by the model"))
        expect(counter).to_have_text(re.compile(r"^\d+ / [\d,]+ tokens$"))
        _shot(page, f"counter-exact-{name}")
        assert page.errors == []
        page.context.close()
    finally:
        keep_alive(-1)


def test_a_thinking_models_thoughts_are_shown_folded(browser, live_appliance, answers):
    from tests.inference.text.thinking_templates import FEW_SHOT

    answers(max_tokens=60, temperature=0.0)
    live_appliance.shell(f"{MODEL} m.chat_template_override = {FEW_SHOT!r}; m.save()")
    try:
        page = _open(browser, live_appliance, PHONE, dark=True)
        page.fill("#prompt", "Hi")
        page.click("#send")
        _wait_done(page, 1)
        thinking = page.locator(".msg-assistant details.thinking")
        expect(thinking).to_be_visible()
        expect(thinking.locator("summary")).to_contain_text("Thought for")
        expect(thinking.locator(".thinking-body")).to_be_hidden()  # folded
        assert "<think>" not in _answer(page).inner_text()
        thinking.locator("summary").click()
        expect(thinking.locator(".thinking-body")).not_to_have_text("")
        _shot(page, "thinking-phone-dark")
        assert page.errors == []
        page.context.close()
    finally:
        live_appliance.shell(f"{MODEL} m.chat_template_override = ''; m.save()")


def test_code_in_an_answer_is_highlighted_and_has_its_own_copy_button(browser, live_appliance):
    code = "```python\\ndef water(plant):\\n    return plant.soil < 0.3\\n```"
    out = live_appliance.shell(
        "from django.contrib.auth.models import User; from dashboard.models import Conversation,"
        " Message; c = Conversation.objects.create(user=User.objects.get(username='alice'),"
        " title='code'); Message.objects.create(conversation=c, role='user', content='code?');"
        f" Message.objects.create(conversation=c, role='assistant', content='Here:\\n\\n{code}');"
        " print('conversation', c.pk)"
    )
    cid = re.search(r"conversation (\d+)", out).group(1)
    page = _open(browser, live_appliance, DESKTOP, dark=True)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_appliance.url)
    page.goto(f"{live_appliance.url}/c/{cid}/")
    block = page.locator(".msg-assistant pre code")
    expect(block).to_have_class(re.compile(r"\bhljs\b"))
    expect(block.locator("span[class^=hljs-]").first).to_be_visible()
    page.click(".msg-assistant .copy-code")
    expect(page.locator(".msg-assistant .copy-code")).to_have_attribute("data-copied", "true")
    assert page.evaluate("navigator.clipboard.readText()").startswith("def water(plant):")
    _shot(page, "code-desktop-dark")
    assert page.errors == []
    page.context.close()


def test_the_page_marks_where_the_older_left_out_turns_end(browser, live_appliance):
    # A conversation that outgrew its context: the model reads from the third message on.
    out = live_appliance.shell(
        "from django.contrib.auth.models import User; from dashboard.models import Conversation,"
        " Message; c = Conversation.objects.create(user=User.objects.get(username='alice'),"
        " title='outgrown'); p = None\n"
        "for i in range(6):\n"
        "    p = Message.objects.create(conversation=c, parent=p, content=f'turn {i}',"
        " role='user' if i % 2 == 0 else 'assistant')\n"
        "    c.context_start = p if i == 2 else c.context_start\n"
        "c.leaf = p; c.save(); print('conversation', c.pk)"
    )
    cid = re.search(r"conversation (\d+)", out).group(1)
    page = _open(browser, live_appliance, PHONE)
    page.goto(f"{live_appliance.url}/c/{cid}/")
    marker = page.locator(".messages .left-out")
    expect(marker).to_contain_text("the 2 messages above are no longer sent to the model")
    # It sits right before the first message the model still reads.
    following = marker.evaluate("m => m.nextElementSibling.querySelector('.msg-body').textContent")
    assert following == "turn 2"
    page.evaluate("document.getElementById('messages').scrollTop = 0")
    _shot(page, "left-out-phone")
    page.context.close()
