"""A live appliance for end-to-end tests: `manage.py` commands and `manage.py serve` in
subprocesses, with a data directory (file SQLite) of its own, exactly as a user runs it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveAppliance:
    def __init__(self, data_dir: Path, **env: str):
        self.data_dir = data_dir
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")},
            "DJANGO_SETTINGS_MODULE": "appliance.settings",
            "APPLIANCE_DATA_DIR": str(data_dir),
            "ENGINE_THREADS": "2",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-4000:]}")
        return done.stdout

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code)

    def start(self, *, setup: bool = False, timeout: float = 180, **env: str) -> "LiveAppliance":
        """Serve on a free port and wait for /healthz; `setup` lets serve migrate and bootstrap."""
        self.port = free_port()
        command = [sys.executable, "manage.py", "serve", "--port", str(self.port)]
        if not setup:
            command.append("--skip-setup")
        log = open(self.log_path, "w")  # noqa: SIM115 - the server writes to it while it runs
        self.process = subprocess.Popen(
            command, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not come up:\n{self.log_tail()}")

    def runner_processes(self) -> list:
        """The runner processes holding a model (their pids as /healthz gives them), children
        of this server: a spare runner waiting for its next load holds none and is not one."""
        import psutil

        health = httpx.get(f"{self.url}/healthz", timeout=10).json()
        pids = {runner["pid"] for worker in health.get("workers", [])
                for runner in worker.get("runners", []) if runner.get("pid")}  # fmt: skip
        children = psutil.Process(self.process.pid).children()
        return [child for child in children if child.pid in pids]

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"serve-{self.port}.log"

    def log_tail(self) -> str:
        return self.log_path.read_text()[-6000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
