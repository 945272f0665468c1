"""Warm memory and speculation on the dashboard, in a real browser (Debian's chromium): the
kept-prompts card of each model (its tiers against their bounds, where requests found their
cached tokens, the time it saved), the generation tile's tokens per step and kept drafts, and
the step panel's drafted tokens.

The page is fed its socket's frames by Playwright, cut by the real panels() from hand-made
engine snapshots shaped as Engine.snapshot() gives them (tests/dashboard/web/test_panels.py
checks that shape against a real engine)."""

import json

import pytest
from playwright.sync_api import expect

from dashboard.web.panels import panels
from tests.dashboard.browser.test_dashboard_apps_in_a_browser import STEPS, FedDashboard, shot

pytestmark = pytest.mark.browser

SPECULATING_FROM = 30  # the steps before it read a prompt beside two plain streams


def warm_engine() -> dict:
    """A model with both tiers, most requests finding their prompt kept, and a stream copying
    text back whose drafts are mostly kept."""
    steps = {key: [] for key in ("ago", "decode", "prompt", "ms", "seqs", "background",
                                 "interactive", "paused", "verify", "output")}  # fmt: skip
    for i in range(STEPS):
        drafting = i >= SPECULATING_FROM
        verify = 6 + i % 3 if drafting else 0
        prompt = 0 if drafting else 96
        row = {"ago": round((STEPS - i) * 0.12, 2), "decode": 2 + verify, "prompt": prompt,
               "ms": 45.0 + verify * 4 + prompt * 0.3, "seqs": 2 + (1 if prompt else 0),
               "background": 0, "interactive": 1, "paused": 0, "verify": verify,
               "output": 2 + (verify - 1 if drafting else 0)}  # fmt: skip
        for key, value in row.items():
            steps[key].append(value)
    return {
        "prompt_tps": 380.0, "output_tps": 61.0, "queue_depth": 0, "active_sequences": 2,
        "prefilling": 0, "decoding": 2, "slots": 4, "kv_fill": 0.31, "itl_target": 0.1,
        "window_s": 10.0, "outcomes": {"stop": 25}, "streams": [], "shares": [],
        "steps": steps,
        "prompt_cache": {
            "enabled": True,
            "use": {"admitted": {"resident": 12, "ram": 5, "disk": 2, "miss": 6},
                    "tokens": {"resident": 5400, "ram": 2100, "disk": 900},
                    "restore_seconds": 0.08, "saved_seconds": 11.5},
            "restore_bytes_per_s": 9.5e9, "disk_bytes_per_s": 1.2e9,
            "ram": {"bytes": 700 << 20, "bound": 1 << 30, "entries": 14, "peak": 900 << 20},
            "disk": {"bytes": 3 << 30, "entries": 40, "bound": 20 << 30, "enabled": True},
            "saved": 60, "spilled": 40, "dropped": 1, "fetched": 2, "unreadable": 0,
            "spill_failed": 0, "forgotten": 0, "conversations": [],
        },
        "speculation": {"enabled": True, "mode": "auto", "drafted": 48, "accepted": 47,
                        "drafts": 6, "verify_tokens": 48, "acceptance": 47 / 48,
                        "table_contexts": 10},
    }  # fmt: skip


def cold_engine() -> dict:
    """A second model on a box whose warm memory is off (PROMPT_CACHE_RAM=0), speculation
    off by the model's setting: its slots alone reuse prompts."""
    engine = warm_engine()
    engine["prompt_cache"] = {
        "enabled": False, "restore_bytes_per_s": 2e9, "disk_bytes_per_s": 2e8,
        "use": {"admitted": {"resident": 1, "ram": 0, "disk": 0, "miss": 3},
                "tokens": {"resident": 40, "ram": 0, "disk": 0},
                "restore_seconds": 0.0, "saved_seconds": 0.0},
    }  # fmt: skip
    engine["speculation"] = {"enabled": False, "mode": "off", "drafted": 0, "accepted": 0,
                             "drafts": 0}  # fmt: skip
    return engine


def frame(models: dict) -> str:
    snapshot = {"worker": "embedded", "mode": "embedded", "time": 1000.0, "loading": None,
                "loaded": [{"name": name, "size_bytes": 98_000_000, "busy": True}
                           for name in models],
                "models": models,
                "system": {"gpus": [], "rss_bytes": 900_000_000, "model_bytes": 98_000_000,
                           "ram_total_bytes": 16_000_000_000, "cpu_percent": 60.0,
                           "cpu_count": 2}}  # fmt: skip
    return json.dumps({"type": "snapshot", "panels": panels(snapshot)}, allow_nan=False)


def test_the_dashboard_shows_kept_prompts_and_what_speculation_kept(
    browser, live_appliance, artifacts
):
    dash = FedDashboard(browser, live_appliance, {"width": 1366, "height": 900})
    page = dash.page
    warm = warm_engine()
    fed = frame({"smollm2-135m-instruct": warm})
    dash.feed(fed)

    # 1. The model's card: each tier against its bound, where requests found cached tokens.
    card = page.locator(".kept-model")
    expect(card).to_have_count(1)
    expect(card).to_contain_text("RAM and disk")
    bars = card.locator(".mem-row")
    expect(bars.nth(0)).to_contain_text("700 MiB of 1.0 GiB · 14 prompts")
    expect(bars.nth(1)).to_contain_text("3.0 GiB of 20.0 GiB · 40 prompts")
    width = bars.nth(0).locator(".mem-fill").evaluate("e => e.style.width")
    assert width == "68.36%"  # 700 MiB of 1,024
    figures = card.locator(".kept-figures").inner_text()
    assert "76% of 25 requests found cached tokens" in figures  # 19 of 25
    assert "28% from RAM or disk" in figures and "11.50 s prompt time saved" in figures
    rows = [r.locator("td").all_inner_texts() for r in card.locator("tbody tr").all()]
    # found in: resident, RAM, disk, none
    assert rows == [["requests", "12", "5", "2", "6"],
                    ["tokens", "5,400", "2,100", "900", "–"]]  # fmt: skip
    expect(card).to_contain_text("restore rate 9.5 GB/s from RAM, 1.2 GB/s from disk")
    expect(page.locator("#kept-summary")).to_contain_text("700 MiB in RAM · 3.0 GiB on disk")

    # 2. The generation tile: tokens per step (steps that read a prompt left out) and drafts.
    # Steps 30-59 carry 2 streams and 6-8 drafted tokens, kept but one: (2 + 5..7) out.
    per_step = sum(2 + (6 + i % 3) - 1 for i in range(SPECULATING_FROM, STEPS)) / (
        2 * (STEPS - SPECULATING_FROM))  # fmt: skip
    expect(page.locator("#t-output-steps")).to_have_text(f"{per_step:.2f} tokens/step")
    expect(page.locator("#t-output-spec")).to_have_text("speculation auto · 47/48 drafts kept")

    # 3. The step panel: drafted tokens in their own colour, and in the hover sentence.
    expect(page.locator("#legend-verify")).to_be_visible()
    expect(page.locator("#steps-summary")).to_contain_text(
        f"{STEPS - SPECULATING_FROM} verified drafted tokens")  # fmt: skip
    steps = warm["steps"]
    last = STEPS - 2
    decode, verify, output = steps["decode"][last], steps["verify"][last], steps["output"][last]
    assert (f"{decode} decode tokens (2 streams writing; {verify} drafted tokens verified) · "
            f"{output} tokens out") in dash.hover_step(last)  # fmt: skip
    assert "drafted" not in dash.hover_step(3)  # a step that read a prompt, no draft
    shot(page, artifacts, "dashboard-warm-light.png", full_page=True)
    dash.feed(fed, times=1)
    shot(page.locator(".kept-card"), artifacts, "dashboard-warm-kept-light.png")
    dash.feed(fed, times=1)
    dash.hover_step(STEPS - 2)
    shot(page.locator(".steps-card"), artifacts, "dashboard-warm-steps-light.png")

    # 4. A second model without warm memory says so, and keeps its slots' reuse.
    two = frame({"smollm2-135m-instruct": warm, "cold-model": cold_engine()})
    dash.feed(two)
    expect(page.locator(".kept-model")).to_have_count(2)
    cold = page.locator(".kept-model", has_text="cold-model")
    expect(cold).to_contain_text("no warm memory")
    expect(cold).to_contain_text("25% of 4 requests found cached tokens")
    expect(cold.locator(".mem-row")).to_have_count(0)
    expect(page.locator("#t-output-spec")).to_have_text("speculation auto/off · 47/48 drafts kept")
    page.emulate_media(color_scheme="dark")
    dash.feed(two, times=2)
    shot(page.locator(".kept-card"), artifacts, "dashboard-warm-kept-dark.png")
    assert dash.errors == []
    page.close()

    phone = FedDashboard(browser, live_appliance, {"width": 390, "height": 844}, is_mobile=True)
    phone.feed(two)
    expect(phone.page.locator(".kept-model")).to_have_count(2)
    # The table of where cached tokens were found fits a phone: nothing to scroll sideways.
    for table in phone.page.locator(".kept-model .table-wrap").all():
        assert table.evaluate("e => e.scrollWidth <= e.clientWidth")
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 391
    shot(phone.page.locator(".kept-card"), artifacts, "dashboard-warm-kept-phone.png")
    phone.feed(two, times=1)
    shot(phone.page.locator(".tiles"), artifacts, "dashboard-warm-tiles-phone.png")
    assert phone.errors == []
    phone.page.close()

