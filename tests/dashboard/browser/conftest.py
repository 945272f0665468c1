"""A live appliance for the browser tests: `manage.py serve` in a subprocess, on a free port,
with its own data directory (file SQLite), exactly as a user starts it."""

from pathlib import Path

import pytest

from tests.live import ROOT, LiveAppliance

ARTIFACTS = ROOT / "test-artifacts"
ADMIN_PASSWORD = "pw-admin-browser-1"


@pytest.fixture(scope="session")
def live_appliance(tmp_path_factory):
    appliance = LiveAppliance(
        tmp_path_factory.mktemp("appliance-live"),
        ADMIN_PASSWORD=ADMIN_PASSWORD,
        TELEMETRY_INTERVAL_S="0.25",
    )
    # The real setup (migrate, admin from ADMIN_PASSWORD, the packaged starter model), then
    # short answers so the tests take seconds on a small box, and a member without staff rights.
    appliance.manage("migrate", "--verbosity", "0")
    appliance.manage("bootstrap")
    appliance.shell(
        "from inference.models import LLMModel; from django.contrib.auth.models import User;"
        "LLMModel.objects.update(default_params={'max_tokens': 48}, n_threads=2);"
        "User.objects.create_user('alice', password='pw-alice-123')"
    )
    appliance.start()
    try:
        yield appliance
    finally:
        appliance.stop()


@pytest.fixture(scope="module")
def browser():
    # Module scope, not session: while Playwright's sync API is open it keeps an event loop
    # running in the main thread, which breaks every later test that runs asyncio.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox"]
        )
        yield browser
        browser.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def log_in(page, appliance: LiveAppliance, username: str, password: str) -> None:
    page.goto(appliance.url + "/")
    assert "/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(appliance.url + "/")
