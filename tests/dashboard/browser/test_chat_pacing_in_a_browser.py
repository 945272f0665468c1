"""The chat page's pacer (static/js/chat_pacer.js) in a real browser: how a streamed answer
reaches the reader. The pacer is driven on a clock of its own (arrivals and frames at given
times), so what it shows at each frame is exact; then a real answer streams through it."""

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.model]

FRAME_MS = 1000 / 60

# Arrivals as (time ms, characters); frames every FRAME_MS until everything is shown. Returns
# [time, characters shown at that frame] for every frame that showed something.
SIMULATE = """([arrivals, frameMs]) => {
  const pacer = window.ChatPacer.create();
  let arrivedChars = 0, shown = 0, next = 0;
  const shows = [];
  const end = arrivals[arrivals.length - 1][0] + 2000;
  for (let t = 0; t <= end; t += frameMs) {
    while (next < arrivals.length && arrivals[next][0] <= t) {
      arrivedChars += arrivals[next][1];
      pacer.arrived(arrivals[next][0], arrivedChars - shown);
      next += 1;
    }
    const count = pacer.reveal(t, arrivedChars - shown);
    if (count > 0) { shown += count; shows.push([t, count]); }
  }
  return { shows, shown, arrived: arrivedChars };
}"""


@pytest.fixture(scope="module")
def chat_page(browser, live_appliance):
    page = browser.new_page()
    log_in(page, live_appliance, "admin", ADMIN_PASSWORD)
    yield page
    page.close()


def simulate(page, arrivals: list[tuple[float, int]]) -> dict:
    return page.evaluate(SIMULATE, [[list(a) for a in arrivals], FRAME_MS])


def test_the_first_token_shows_at_the_first_frame_whole(chat_page):
    result = simulate(chat_page, [(0, 7)])
    assert result["shows"] == [[0, 7]]


def test_a_burst_of_tokens_flows_out_over_the_next_gap_not_at_once(chat_page):
    # A token of 6 characters every 100 ms, then a step that kept a draft: 48 characters at once.
    arrivals = [(100 * n, 6) for n in range(8)] + [(800, 48), (900, 6), (1000, 6)]
    result = simulate(chat_page, arrivals)
    assert result["shown"] == result["arrived"], "the pacer lost characters"
    # Frames fall on a 60 Hz clock: the burst's own are those after it and up to the next
    # arrival's first frame.
    burst = [(t, n) for t, n in result["shows"] if 800 < t <= 900 + FRAME_MS]
    assert len(burst) >= 5, f"the burst was not spread: {burst}"
    assert max(n for _, n in burst) <= 10, f"the burst showed in lumps: {burst}"
    # Held back no longer than the gap it is spread over: shown by the next arrival's frame.
    assert sum(n for _, n in burst) >= 48


def test_a_step_as_long_as_the_recent_longest_flows_on_rather_than_stopping(chat_page):
    # Decode-only steps of 40 ms, and every fourth one also reads a prompt: 130 ms.
    arrivals, t = [], 0.0
    for n in range(24):
        arrivals.append((t, 5))
        t += 130 if n % 4 == 3 else 40
    result = simulate(chat_page, arrivals)
    assert result["shown"] == result["arrived"]
    settled = [time for time, _ in result["shows"] if time >= 400]  # a long step is known
    last_arrival = arrivals[-1][0]
    stops = [b - a for a, b in zip(settled, settled[1:], strict=False) if b <= last_arrival]
    # Arrivals stop for 130 ms at a time; what the reader sees never stops for two frames.
    assert max(stops) <= 2 * FRAME_MS + 1, f"the reader saw stops of {max(stops):.0f} ms"


def test_nothing_is_held_longer_than_the_largest_spread(chat_page):
    # A slow stream: a token every 600 ms is spread over at most MAX_SPREAD_MS.
    arrivals = [(600 * n, 5) for n in range(5)]
    result = simulate(chat_page, arrivals)
    spread = chat_page.evaluate("window.ChatPacer.MAX_SPREAD_MS")
    for arrival, _ in arrivals[1:]:
        shown_by = max(t for t, _ in result["shows"] if t < arrival + 600)
        assert shown_by <= arrival + spread + FRAME_MS


def test_an_emoji_is_never_cut_in_half(chat_page):
    assert chat_page.evaluate("window.ChatPacer.cut('a\\uD83D\\uDE00b', 2)") == 3
    assert chat_page.evaluate("window.ChatPacer.cut('abc', 2)") == 2


def test_a_real_answer_shows_whole_once_it_is_done(chat_page):
    chat_page.fill("#prompt", "Write two sentences about rivers.")
    chat_page.click("#send")
    expect(chat_page.locator(".msg-assistant .figures").last).to_be_visible(timeout=120_000)
    # What the page shows against the saved answer rendered the same way (markdown.js).
    shown, saved = chat_page.evaluate(
        """async () => {
          const body = [...document.querySelectorAll(".msg-assistant .msg-body")].pop();
          const html = await fetch(location.pathname).then((r) => r.text());
          const doc = new DOMParser().parseFromString(html, "text/html");
          const data = JSON.parse(doc.getElementById("chat-data").textContent);
          const rendered = document.createElement("div");
          window.Markdown.renderInto(rendered, data.messages[data.messages.length - 1].content);
          return [body.textContent, rendered.textContent];
        }"""
    )
    assert saved.strip(), "the answer was empty"
    assert shown == saved
