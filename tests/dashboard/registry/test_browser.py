"""The registry pages in a real browser (Debian's chromium) against a live appliance: an upload
over XHR with its progress bar, the hash arriving live, and a real load of the starter model."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.inference.registry.ggufs import tiny_gguf

pytestmark = [pytest.mark.browser, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "pw-registry-browser-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    """`manage.py serve` (migrate, bootstrap with the starter model, Daphne) in a subprocess."""
    data_dir = tmp_path_factory.mktemp("registry-live")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")},
        "DJANGO_SETTINGS_MODULE": "appliance.settings", "APPLIANCE_DATA_DIR": str(data_dir),
        "ADMIN_PASSWORD": PASSWORD, "ENGINE_THREADS": "2",
    }  # fmt: skip
    log = open(data_dir / "serve.log", "w")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, (data_dir / "serve.log").read_text()
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the appliance did not start"
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


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
    expect(page.locator("#measured")).to_contain_text("MiB")
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / "registry-model.png"), full_page=True)
    page.goto(appliance + "/models/")
    expect(page.locator("#loaded-rows")).to_contain_text("smollm2-135m-instruct")
    page.screenshot(path=str(artifacts / "registry-models.png"), full_page=True)
    assert page.errors == []
