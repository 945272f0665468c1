"""The registry pages in a real browser (Debian's chromium) against a live appliance: an upload
over XHR with its progress bar, the hash arriving live, and a real load of the starter model."""

import re

import pytest
from playwright.sync_api import expect

from tests.inference.ggufs import tiny_gguf
from tests.live import ROOT, LiveAppliance

pytestmark = [pytest.mark.browser, pytest.mark.model]

PASSWORD = "pw-registry-browser-1"


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    """`manage.py serve` (migrate, bootstrap with the starter model, uvicorn) in a subprocess;
    the tests get its URL."""
    live = LiveAppliance(tmp_path_factory.mktemp("registry-live"), ADMIN_PASSWORD=PASSWORD)
    live.start(setup=True)
    try:
        yield live.url
    finally:
        live.stop()


@pytest.fixture(scope="module")
def page(appliance):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--no-sandbox"])  # fmt: skip
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.goto(appliance + "/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(appliance + "/")
        yield page
        browser.close()


def test_an_upload_shows_progress_and_lands_on_the_models_page_with_its_hash(
    page, appliance, tmp_path
):
    model = tiny_gguf(tmp_path / "Browser-Upload.gguf")
    page.goto(appliance + "/models/")
    expect(page.locator("#registry-table")).to_contain_text("smollm2-135m-instruct")

    page.set_input_files("#upload-form input[type=file]", str(model))
    page.click("#upload-form button[type=submit]")

    page.wait_for_url(appliance + "/models/browser-upload/")
    # The hash job runs on a thread; the page polls it until the sha256 replaces "hashing…".
    expect(page.locator("#sha256 code")).to_have_text(
        __import__("hashlib").sha256(model.read_bytes()).hexdigest(), timeout=30_000
    )
    expect(page.locator("dl.facts")).to_contain_text("llama")
    assert page.errors == []


def test_a_corrupt_upload_is_refused_on_the_page(page, appliance, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    page.goto(appliance + "/models/")
    page.set_input_files("#upload-form input[type=file]", str(broken))
    page.click("#upload-form button[type=submit]")
    expect(page.locator("#upload-status")).to_contain_text("Refused: broken.gguf is not a usable")
    assert page.url == appliance + "/models/"


def test_loading_the_starter_model_shows_it_loaded_with_what_it_took(page, appliance):
    page.goto(appliance + "/models/smollm2-135m-instruct/")
    expect(page.locator("#loaded-badge")).to_have_text("not loaded")
    page.click(".load-form button")
    page.wait_for_load_state()
    expect(page.locator(".flash")).to_contain_text("smollm2-135m-instruct is loaded in",
                                                   timeout=120_000)  # fmt: skip
    expect(page.locator("#loaded-badge")).to_have_text("loaded")
    expect(page.locator("#measured")).to_contain_text(re.compile(r"^\d+(\.\d)? (MiB|GiB) in "))
    expect(page.locator("#load-state")).to_contain_text(re.compile(r"^Loaded \d+s ago"))
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / "registry-model.png"), full_page=True)
    page.goto(appliance + "/models/")
    expect(page.locator("#loaded-rows")).to_contain_text("smollm2-135m-instruct")
    page.screenshot(path=str(artifacts / "registry-models.png"), full_page=True)
    assert page.errors == []


def test_a_derived_model_made_on_the_models_page_shows_its_own_settings(page, appliance):
    page.goto(appliance + "/models/")
    page.fill("#derive-form input[name=name]", "house-butler")
    page.select_option("#derive-form select[name=base]", "smollm2-135m-instruct")
    page.fill("#derive-form textarea[name=system]", "You are the butler of this house.")
    page.fill("#derive-form input[name=temperature]", "0.3")
    page.click("#derive-form button[type=submit]")
    expect(page.locator(".flash")).to_contain_text("Made house-butler")
    page.goto(appliance + "/models/house-butler/")
    expect(page.locator("#derived-from")).to_contain_text("Derived from smollm2-135m-instruct")
    expect(page.locator("#id_system_prompt")).to_have_value("You are the butler of this house.")
    expect(page.locator("#id_sampling_temperature")).to_have_value("0.3")
    expect(page.locator("#id_n_ctx")).to_have_count(0)  # its load settings are its base's
    page.click("#derived-from a >> nth=0")
    page.wait_for_url(appliance + "/models/smollm2-135m-instruct/")
    page.go_back()
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / "registry-derived.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(artifacts / "registry-derived-phone.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    assert page.errors == []
