"""Real inference worker processes for the split-mode tests: the command docker-compose.yml's
"inference" service runs, started with subprocess against the tests' Redis database."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from inference.serving import split_protocol as protocol

REDIS_URL = "redis://127.0.0.1:6379/15"  # the split-mode tests' own database


def clean_split_redis() -> redis.Redis:
    """A client of the split-mode tests' Redis database, emptied: leftovers of an earlier run
    (queued tasks, heartbeats) would be served by the workers a test starts. Skips the test
    when that Redis does not answer (CI starts one)."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis on 127.0.0.1:6379 does not answer: {exc}")
    client.flushdb()
    return client


ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")
START_TIMEOUT_S = 120  # importing Django, Celery and llama.cpp on a shared 2-core box


class WorkerProcess:
    """One `celery -A appliance worker -Q inference -P threads` process."""

    def __init__(
        self, workdir: Path, redis_url: str = REDIS_URL, env: dict | None = None, *,
        chatter: bool = False,
    ):  # fmt: skip
        self.label = f"test-{uuid.uuid4().hex[:8]}"
        self.redis_url = redis_url
        self.extra_env = env or {}  # e.g. MODELS_DIR: the box's own model files
        self.chatter = chatter
        self.workdir = workdir
        self.log_path = workdir / f"{self.label}.log"
        self.process: subprocess.Popen | None = None
        self.name: str | None = None  # "<label>@<host>", as the worker names itself in Redis

    @staticmethod
    def command(node_name: str, *, chatter: bool = False) -> list[str]:
        """docker-compose.yml's inference command, with fewer threads and, unless `chatter`,
        without Celery's own heartbeat, mingle and gossip (compose runs them: what a broker
        restart does to them is tested with them on)."""
        quiet = [] if chatter else ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        return [
            str(CELERY), "-A", "appliance", "worker", "-Q", "inference", "-P", "threads",
            "-c", "8", *quiet, "-n", node_name, "-l", "info",
        ]  # fmt: skip

    def start(self) -> "WorkerProcess":
        data_dir = self.workdir / f"{self.label}-data"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "DJANGO_SETTINGS_MODULE": "appliance.settings",
            "APPLIANCE_DATA_DIR": str(data_dir),
            # No database the worker could reach: it must not need one.
            "DATABASE_URL": "sqlite:////nonexistent/no-database-here.sqlite3",
            "TELEMETRY_INTERVAL_S": "0.5",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        env.pop("WORKER_NAME", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(f"{self.label}@%h", chatter=self.chatter),
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # kill() reaches the whole process group
            )
        return self

    def wait_until_alive(self, timeout: float = START_TIMEOUT_S) -> str:
        """The worker's name once its heartbeat is in Redis."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for key in client.scan_iter(match=protocol.alive_key(f"{self.label}@*")):
                self.name = protocol.worker_from_key(key)
                return self.name
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{self.log()}")
            time.sleep(0.2)
        raise RuntimeError(f"the worker did not come up within {timeout} s:\n{self.log()}")

    def wait_until_serving(self, sha256: str, timeout: float = START_TIMEOUT_S) -> None:
        """Once the worker announces that it can serve the model with this digest."""
        from inference.serving.announcement import WorkerAnnouncement

        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        name = self.name or self.wait_until_alive(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = client.get(protocol.announce_key(name))
            if raw and WorkerAnnouncement.from_json(raw).serves_sha(sha256):
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{self.log()}")
            time.sleep(0.2)
        raise RuntimeError(f"the worker did not announce {sha256[:12]} in {timeout} s:\n"
                           f"{self.log()}")  # fmt: skip

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a box loses power."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """A warm shutdown (SIGTERM), then SIGKILL if it takes too long."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""
