"""A real appliance in a subprocess: its own data dir, migrated and bootstrapped (the starter
model registered and hashed), API keys made with `manage.py create_api_key`, served by uvicorn
through `manage.py serve` on a free localhost port."""

import json
from pathlib import Path

import httpx

from tests.live import LiveAppliance

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


class Appliance(LiveAppliance):
    """A live appliance with the API keys the tests made for it."""

    def __init__(self, data_dir: Path, env: dict | None = None, keys: dict | None = None):
        super().__init__(data_dir)
        if env is not None:
            self.env = env
        self.keys: dict[str, str] = dict(keys or {})

    def create_key(self, name: str, scope: str = "chat") -> str:
        raw = self.manage("create_api_key", name, "--scope", scope).strip()
        self.keys[name] = raw
        return raw

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
    appliance = Appliance(data_dir)
    appliance.env.update(
        ADMIN_PASSWORD="pw-admin-test-1", API_RATE_LIMIT_PER_MINUTE="100000", LOG_LEVEL="WARNING"
    )
    appliance.manage("migrate", "--no-input", "-v", "0")
    appliance.manage("bootstrap")
    appliance.shell(SETUP)
    # Keys through the management command, as an admin would; the rest in one process.
    appliance.create_key("admin-app", "admin")
    appliance.create_key("manage-app", "manage")
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
