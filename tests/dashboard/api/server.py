"""A real appliance in a subprocess: its own data dir, migrated and bootstrapped (the starter
model registered and hashed), API keys made with `manage.py create_api_key`, served by Daphne
through `manage.py serve` on a free localhost port."""

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
STARTER = "smollm2-135m-instruct"
BUSY_KEYS = [f"busy-{i}" for i in range(8)]

# Small settings for a 2-core box; the model stays loaded between tests (keep_alive -1).
SETUP = f"""
from inference.models import LLMModel
LLMModel.objects.filter(name={STARTER!r}).update(
    n_ctx=2048, parallel=4, n_threads=2, keep_alive="-1", is_default=True
)
assert LLMModel.objects.filter(name={STARTER!r}).exists(), "the starter model is not registered"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Appliance:
    data_dir: Path
    env: dict
    keys: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-4000:]}")
        return done.stdout

    def create_key(self, name: str, scope: str = "chat") -> str:
        raw = self.manage("create_api_key", name, "--scope", scope).strip()
        self.keys[name] = raw
        return raw

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code)

    def create_keys(self, names: list[str], scope: str = "chat") -> list[str]:
        """Several keys in one process start (the command makes one key per run)."""
        out = self.shell(
            "from dashboard.models import ApiKey\n"
            f"for name in {names!r}:\n"
            f"    print('KEY', ApiKey.create(name, {scope!r})[1])\n"
        )
        raws = [line.split()[1] for line in out.splitlines() if line.startswith("KEY ")]
        self.keys.update(zip(names, raws, strict=True))
        return raws

    def headers(self, key: str) -> dict:
        return {"Authorization": f"Bearer {self.keys[key]}"}

    def start(self, **env: str) -> "Appliance":
        self.port = free_port()
        log = open(self.data_dir / f"serve-{self.port}.log", "w")  # noqa: SIM115 - the server's
        self.process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "serve",
                "--skip-setup",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/api/openapi.json", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not come up:\n{self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted(self.data_dir.glob(f"serve-{self.port}.log"))
        return logs[-1].read_text()[-6000:] if logs else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def running_sequences(self) -> float:
        """appliance_requests_running summed over models, read from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", headers=self.headers("admin-app"), timeout=10).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "appliance_requests_running"
            for sample in family.samples
        )


def prepare(data_dir: Path) -> Appliance:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "appliance.settings",
            "APPLIANCE_DATA_DIR": str(data_dir),
            "ADMIN_PASSWORD": "pw-admin-test-1",
            "ENGINE_THREADS": "2",
            "API_RATE_LIMIT_PER_MINUTE": "100000",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    appliance = Appliance(data_dir, env)
    appliance.manage("migrate", "--no-input", "-v", "0")
    appliance.manage("bootstrap")
    appliance.shell(SETUP)
    # Two keys through the management command, as an admin would; the rest in one process.
    appliance.create_key("admin-app", "admin")
    appliance.create_key("chat-app")
    appliance.create_keys(
        ["revoked-app", "limited-app", "openai-limited", "ollama-limited", *BUSY_KEYS]
    )
    appliance.shell(
        "from dashboard.models import ApiKey; "
        "ApiKey.objects.filter(name='revoked-app').update(revoked=True)"
    )
    return appliance


def read_json(response: httpx.Response) -> dict:
    try:
        return response.json()
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON ({response.status_code}): {response.text[:500]}") from exc
