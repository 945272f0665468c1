"""The models and API keys pages in a real browser (Debian's chromium) against a live appliance
of this module's own (its settings changes stay here), at desktop and phone width: the key's
copy button and ready examples (run for real against the appliance), the revoke confirmation,
the default-sampling form and "Save and reload" on the loaded starter model, the favicon."""

import re
import subprocess
import sys

import httpx
import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import log_in
from tests.live import ROOT, LiveAppliance

pytestmark = [pytest.mark.browser, pytest.mark.model]

PASSWORD = "pw-models-keys-1"
SHOTS = ROOT / "test-artifacts"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
LOAD_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    live = LiveAppliance(tmp_path_factory.mktemp("models-keys-live"), ADMIN_PASSWORD=PASSWORD)
    live.manage("migrate", "--verbosity", "0")
    live.manage("bootstrap")
    live.shell(  # small enough for 2 cores: a short context, one sequence, short answers
        "from inference.models import LLMModel;"
        "LLMModel.objects.update(n_ctx=512, parallel=1, n_threads=2,"
        " default_params={'max_tokens': 24, 'temperature': 0.0})"
    )
    live.start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def page(browser, appliance):
    """A signed-in admin's page that records script errors and every 404 it meets."""
    context = browser.new_context(viewport=DESKTOP)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=appliance.url)
    page = context.new_page()
    page.errors = []
    page.missing = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("response", lambda r: page.missing.append(r.url) if r.status == 404 else None)
    log_in(page, appliance, "admin", PASSWORD)
    yield page
    context.close()


def shoot(page, name: str, focus: str = "") -> None:
    """Full-page screenshots at desktop and phone width, and the `focus` element alone."""
    SHOTS.mkdir(exist_ok=True)
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.wait_for_timeout(150)
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=True)
        if focus:
            page.locator(focus).screenshot(path=str(SHOTS / f"{name}-{label}-focus.png"))
    page.set_viewport_size(DESKTOP)


def test_a_new_key_is_copied_and_its_examples_work_as_shown(page, appliance):
    page.goto(appliance.url + "/api-keys/")
    page.fill("#id_name", "home-assistant")
    page.click("form[action='/api-keys/'] button[type=submit]")
    key = page.locator("#new-key").inner_text()
    assert key.startswith("hla-")

    page.click("button[data-copy=new-key]")
    expect(page.locator("button[data-copy=new-key]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key

    # Home Assistant's fields: this box's address as the browser reached it, the key, a model.
    expect(page.locator("#ha-url")).to_have_text(appliance.url)
    expect(page.locator("#ha-key")).to_have_text(key)
    expect(page.locator("#ha-model")).to_have_text("smollm2-135m-instruct")
    page.click("button[data-copy=ex-python-openai]")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == page.locator("#ex-python-openai").inner_text()
    shoot(page, "keys-new")

    # The examples are run as they are shown: the two Python clients and curl.
    for slug in ("python-openai", "python-ollama"):
        code = page.locator(f"#ex-{slug}").inner_text()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=180)  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip(), (slug, done.stderr[-2000:])
    for slug, marker in (("curl-openai", '"choices"'), ("curl-ollama", '"message"')):
        command = page.locator(f"#ex-{slug}").inner_text()
        done = subprocess.run(["bash", "-c", command + " --silent --show-error"],
                              capture_output=True, text=True, timeout=180)  # fmt: skip
        assert done.returncode == 0 and marker in done.stdout, (slug, done.stdout, done.stderr)
    assert page.errors == [] and page.missing == []


def test_revoking_a_key_asks_first(page, appliance):
    page.goto(appliance.url + "/api-keys/")
    page.fill("#id_name", "old-script")
    page.click("form[action='/api-keys/'] button[type=submit]")
    key = page.locator("#new-key").inner_text()

    row = page.locator("table.keys tr", has_text="old-script")
    row.locator("button", has_text="Revoke").click()
    expect(page.locator("#revoke-confirm h1")).to_have_text("Revoke the key old-script?")
    shoot(page, "keys-revoke-confirm")
    page.click("text=Keep it")
    expect(row).not_to_contain_text("revoked")
    assert httpx.get(appliance.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                     timeout=30).status_code == 200  # fmt: skip

    row.locator("button", has_text="Revoke").click()
    page.click("#revoke-confirm button[type=submit]")
    expect(page.locator(".flash")).to_contain_text("the key old-script is revoked")
    expect(page.locator("table.keys tr", has_text="old-script")).to_contain_text("revoked")
    assert httpx.get(appliance.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                     timeout=30).status_code == 401  # fmt: skip
    assert page.errors == [] and page.missing == []


def test_sampling_defaults_are_a_form_and_save_and_reload_applies_settings(page, appliance):
    url = appliance.url + "/models/smollm2-135m-instruct/"
    page.goto(url)
    page.click("form[action$='/unload/'] button")  # the examples above may have loaded it
    expect(page.locator(".flash")).to_contain_text("smollm2-135m-instruct")
    expect(page.locator("#loaded-badge")).to_have_text("not loaded")
    expect(page.locator("#load-state")).to_contain_text("Not loaded")
    expect(page.locator("#apply-reload")).to_have_count(0)  # nothing to reload yet

    # A bound refused in the browser's words and the server's: temperature at most 5.
    page.fill("#id_sampling_temperature", "9")
    page.click("#settings-form button:has-text('Save settings')")
    expect(page.locator("#sampling .errorlist")).to_contain_text("less than or equal to 5")
    page.fill("#id_sampling_temperature", "0.3")
    page.fill("#id_sampling_top_k", "20")
    page.fill("#id_sampling_stop", "User:\n###")
    page.click("#settings-form button:has-text('Save settings')")
    expect(page.locator(".flash")).to_contain_text("saved; they apply when it loads")
    expect(page.locator("#id_sampling_temperature")).to_have_value("0.3")
    expect(page.locator("#id_sampling_stop")).to_have_value("User:\n###")

    page.click(".load-form button")
    expect(page.locator(".flash")).to_contain_text("is loaded in", timeout=LOAD_TIMEOUT_MS)
    expect(page.locator("#loaded-badge")).to_have_text(re.compile("^loaded"))
    expect(page.locator("#load-state")).to_contain_text(re.compile(r"^Loaded \d+s ago"))
    expect(page.locator("#load-state")).to_contain_text("512 tokens per sequence")
    # One sequence (parallel 1): warm memory keeps finished turns in RAM, not in slots.
    expect(page.locator("#kv-line")).to_contain_text(
        "512 tokens per sequence × 1 sequence (1 answering at once; finished turns are kept")

    # One click: a load-time setting changed on a loaded model is saved, unloaded, reloaded.
    page.fill("#id_n_ctx", "1024")
    page.click("#apply-reload")
    expect(page.locator(".flash")).to_contain_text("saved and applied: reloaded",
                                                   timeout=LOAD_TIMEOUT_MS)  # fmt: skip
    expect(page.locator("#load-state")).to_contain_text("1024 tokens per sequence")
    expect(page.locator("#loaded-badge")).to_have_text(re.compile("^loaded"))
    expect(page.locator("#stale-settings")).to_have_count(0)
    shoot(page, "model-detail-loaded", focus="#settings-form")
    assert page.errors == [] and page.missing == []


def test_a_failed_job_can_be_retried_and_dismissed(page, appliance):
    page.goto(appliance.url + "/models/")
    # Loopback is never downloaded from (inference.catalog.netguard): a job that fails at once.
    page.fill("#id_url", "http://127.0.0.1:9/model.gguf")
    page.click("form[action$='/download/'] button")
    row = page.locator("#job-rows tr[data-job]").first
    expect(row.locator(".job-state")).to_have_text("failed", timeout=30_000)
    expect(row.locator("button", has_text="Retry")).to_be_visible()
    job = row.get_attribute("data-job")
    shoot(page, "models-failed-job", focus="#job-rows")

    row.locator("button", has_text="Retry").click()
    expect(page.locator(".flash")).to_contain_text(f"Job {job} (download) started again")
    again = page.locator(f"#job-rows tr[data-job='{job}']")
    expect(again.locator(".job-state")).to_have_text("failed", timeout=30_000)
    assert page.locator("#job-rows tr[data-job]").count() == 1  # the same job, run again

    again.locator("button", has_text="Dismiss").click()
    expect(page.locator(f"#job-rows tr[data-job='{job}']")).to_have_count(0)
    expect(page.locator("#job-rows")).to_contain_text("No jobs yet.")
    assert page.errors == [] and page.missing == []


def test_the_favicon_is_linked_and_answered(page, appliance):
    page.goto(appliance.url + "/models/")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon.endswith("favicon.svg")
    assert httpx.get(appliance.url + icon, timeout=30).status_code == 200
    answer = httpx.get(appliance.url + "/favicon.ico", timeout=30, follow_redirects=True)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/svg")
    shoot(page, "models-list")
    assert page.errors == [] and page.missing == []


def test_a_models_kept_prompts_are_shown_and_forgotten_and_speculation_is_a_setting(
    page, appliance
):
    url = appliance.url + "/models/smollm2-135m-instruct/"
    page.goto(url)
    if page.locator("#loaded-badge").inner_text() != "loaded":
        page.click(".load-form button")
        expect(page.locator(".flash")).to_contain_text("is loaded in", timeout=LOAD_TIMEOUT_MS)
    # Two conversations of an app: the model answers with one sequence, so the first turn's
    # KV leaves its slot for the second and is kept in RAM.
    key = appliance.manage("create_api_key", "kept-prompts", "--scope", "chat").strip()
    for topic in ("the garden", "the weather"):
        answer = httpx.post(appliance.url + "/v1/chat/completions", timeout=180,
                            headers={"Authorization": f"Bearer {key}"},
                            json={"model": "smollm2-135m-instruct", "max_tokens": 4,
                                  "messages": [{"role": "user", "content": f"About {topic}: "
                                                + "tell me more, please. " * 30}]})  # fmt: skip
        assert answer.status_code == 200, answer.text
    page.goto(url)
    line = page.locator("#kept-prompts .kept-line")
    expect(line).to_contain_text(re.compile(r"^Kept in RAM \d+ (KiB|MiB|GiB) of [\d.]+ (MiB|GiB)"
                                            r" \([1-9]\d* prompts?\)"))  # fmt: skip
    expect(line).to_contain_text("2 requests since it loaded")
    shoot(page, "model-detail-kept", focus="#kept-prompts")

    page.click("#forget-prompts button")
    expect(page.locator(".flash")).to_contain_text(
        re.compile(r"Forgot [1-9]\d* cached prompts? of smollm2-135m-instruct\."))  # fmt: skip
    expect(line).to_contain_text("(0 prompts)")

    # Speculation is a load setting: off for this model, applied by one "Save and reload".
    expect(page.locator("#id_speculative")).to_have_value("auto")
    page.select_option("#id_speculative", "off")
    page.click("#apply-reload")
    expect(page.locator(".flash")).to_contain_text("saved and applied: reloaded",
                                                   timeout=LOAD_TIMEOUT_MS)  # fmt: skip
    expect(page.locator("#id_speculative")).to_have_value("off")
    shoot(page, "model-detail-speculation", focus="#settings-form")
    assert page.errors == [] and page.missing == []
