"""A live appliance for the browser tests: `manage.py serve` in a subprocess, on a free port,
with its own data directory (file SQLite), exactly as a user starts it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts"
ADMIN_PASSWORD = "pw-admin-browser-1"
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveAppliance:
    def __init__(self, data_dir: Path, port: int):
        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")},
            "DJANGO_SETTINGS_MODULE": "appliance.settings",
            "APPLIANCE_DATA_DIR": str(data_dir),
            "ADMIN_PASSWORD": ADMIN_PASSWORD,
            "TELEMETRY_INTERVAL_S": "0.25",
            "ENGINE_THREADS": "2",
        }

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code)


@pytest.fixture(scope="session")
def live_appliance(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("appliance-live")
    appliance = LiveAppliance(data_dir, _free_port())
    # The real setup (migrate, admin from ADMIN_PASSWORD, the packaged starter model), then
    # short answers so the tests take seconds on a small box, and a member without staff rights.
    appliance.manage("migrate", "--verbosity", "0")
    appliance.manage("bootstrap")
    appliance.shell(
        "from inference.models import LLMModel; from django.contrib.auth.models import User;"
        "LLMModel.objects.update(default_params={'max_tokens': 48}, n_threads=2);"
        "User.objects.create_user('alice', password='pw-alice-123')"
    )
    log = open(data_dir / "serve.log", "w")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--skip-setup", "--port", str(appliance.port)],
        cwd=ROOT, env=appliance.env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"serve exited: {(data_dir / 'serve.log').read_text()}")
            try:
                if httpx.get(appliance.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the appliance did not start")
            time.sleep(0.3)
        yield appliance
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


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
