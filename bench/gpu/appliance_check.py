"""The appliance served end to end on the check's model, as a household runs it: `manage.py
serve` in embedded mode with a data directory of its own, the model found in MODELS_DIR by
bootstrap, an admin API key; then

1. the model page's estimate for its settings (inference.catalog.operations.estimate: the fit,
   its reason, what goes on the GPU), read before anything is loaded, as the load will size it;
2. one chat answer through /v1/chat/completions (which loads the model: the fit, the runner);
3. /metrics' GPU series and /healthz, read back;
4. the dashboard's own panels, read back from its telemetry socket as a signed-in staff page
   gets them (the machine panel: the build, the card, the runner's GPU memory beside llama.cpp's
   split of it);
5. the estimate against NVML's count for the runner process and against llama.cpp's buffers.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from bench.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "gpu-check-admin-password"
ESTIMATE = """
import json
from inference.catalog.operations import estimate
from inference.models import LLMModel
model = LLMModel.objects.get(file_path__endswith={file!r})
found, why = estimate(model)
print("ESTIMATE " + json.dumps(None if found is None else {{
    "name": model.name, "gpu_bytes": found.gpu_bytes, "total_bytes": found.total_bytes,
    "gpu_weights_bytes": found.gpu_weights_bytes, "gpu_kv_cache_bytes": found.gpu_kv_cache_bytes,
    "gpu_compute_bytes": found.gpu_compute_bytes, "gpu_layers": found.gpu_layers,
    "n_layers": found.n_layers, "kv_type": found.kv_type, "ctx_per_seq": found.ctx_per_seq,
    "n_ctx_total": found.n_ctx_total, "reason": found.reason}}))
"""


class Appliance:
    def __init__(self, work: Path, env: dict[str, str]):
        self.data = work / "appliance"
        shutil.rmtree(self.data, ignore_errors=True)
        (self.data / "models").mkdir(parents=True)
        self.env = {**{k: v for k, v in env.items() if k not in ("REDIS_URL", "DATABASE_URL")},
                    "DJANGO_SETTINGS_MODULE": "appliance.settings",
                    "APPLIANCE_DATA_DIR": str(self.data), "MODELS_DIR": str(self.data / "models"),
                    "ADMIN_PASSWORD": ADMIN_PASSWORD, "API_RATE_LIMIT_PER_MINUTE": "100000",
                    "PYTHONUNBUFFERED": "1"}  # fmt: skip
        self.process: subprocess.Popen | None = None
        self.url = ""

    def manage(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def add_model(self, model: Path) -> Path:
        """The model in MODELS_DIR (a hard link where it can be: a GB copy costs seconds)."""
        dest = self.data / "models" / model.name
        try:
            os.link(model, dest)
        except OSError:
            shutil.copy2(model, dest)
        return dest

    def start(self) -> str:
        port = free_port()
        log = open(self.data / "serve.log", "w")  # noqa: SIM115 - the server's, closed with it
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--skip-setup", "--port", str(port)], cwd=ROOT,
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code in (200, 503):
                    return self.url
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"serve did not come up:\n{self.log_tail()}")

    def log_tail(self) -> str:
        path = self.data / "serve.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def gpu_series(text: str) -> dict:
    """The GPU families of a /metrics answer: name -> [{labels..., "value"}]."""
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "gpu" in sample.name:
                found.setdefault(sample.name, []).append({**sample.labels, "value": sample.value})
    return found


def dashboard_panels(url: str, timeout: float = 30) -> dict:
    """The panels a signed-in staff dashboard receives: a login, then the telemetry socket,
    until a snapshot shows the loaded model's runner (or the time is up)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        client.get("/login/")
        token = client.cookies.get("csrftoken", "")
        client.post("/login/", data={"username": "admin", "password": ADMIN_PASSWORD,
                                     "csrfmiddlewaretoken": token})  # fmt: skip
        session = client.cookies.get("sessionid")
    if not session:
        raise RuntimeError("the dashboard's sign-in failed")
    headers = {"Cookie": f"sessionid={session}", "Origin": url}
    last = None
    deadline = time.monotonic() + timeout
    with connect(url.replace("http", "ws", 1) + "/ws/telemetry/",
                 additional_headers=headers, open_timeout=20) as socket:  # fmt: skip
        while time.monotonic() < deadline:
            message = json.loads(socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("type") != "snapshot":
                continue
            last = message["panels"]
            if last.get("machine", {}).get("build") is not None:
                break
    if last is None:
        raise RuntimeError("the telemetry socket sent no snapshot")
    return {key: last.get(key) for key in ("worker", "machine", "memory", "loaded")}


def end_to_end(model: Path, work: Path, env: dict[str, str]) -> dict:
    appliance = Appliance(work, env)
    result: dict = {}
    try:
        placed = appliance.add_model(model)
        appliance.manage("migrate", "--verbosity", "0")
        appliance.manage("bootstrap")
        key = appliance.manage("create_api_key", "gpu-check", "--scope", "admin").strip()
        out = appliance.manage("shell", "-c", ESTIMATE.format(file=placed.name))
        estimate = json.loads(out.split("ESTIMATE ", 1)[1])
        result["estimate"] = estimate
        url = appliance.start()
        headers = {"Authorization": f"Bearer {key}"}
        started = time.perf_counter()
        answer = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=600, json={
            "model": estimate["name"], "max_tokens": 32,
            "messages": [{"role": "user", "content": "Say hello to the box with a GPU."}],
        })  # fmt: skip
        answer.raise_for_status()
        body = answer.json()
        result["chat"] = {"seconds": round(time.perf_counter() - started, 2),
                          "text": body["choices"][0]["message"]["content"][:200],
                          "usage": body.get("usage"), "timings": body.get("timings")}  # fmt: skip
        metrics = httpx.get(url + "/metrics", headers=headers, timeout=60)
        metrics.raise_for_status()
        result["metrics"] = gpu_series(metrics.text)
        result["healthz"] = httpx.get(url + "/healthz", timeout=30).json()
        result["dashboard"] = dashboard_panels(url)
        result["memory_check"] = memory_check(estimate, result["metrics"])
    except Exception as exc:  # noqa: BLE001 - the check reports what it got
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["serve_log"] = appliance.log_tail()
    finally:
        appliance.stop()
    return result


def memory_check(estimate: dict, metrics: dict) -> dict:
    """The estimate's GPU part against NVML's count for the runner process (CUDA's own context
    included) and against what llama.cpp says it allocated (its buffers alone)."""
    nvml = sum(s["value"] for s in metrics.get("appliance_runner_gpu_memory_bytes", []))
    by_part = {s["part"]: s["value"] for s in metrics.get("appliance_runner_gpu_buffer_bytes", [])}
    buffers = sum(by_part.values())
    estimated = estimate["gpu_bytes"]
    check = {"estimate_gpu_bytes": estimated, "nvml_runner_bytes": nvml or None,
             "llama_cpp_gpu_buffer_bytes": buffers or None,
             "parts": {part: {"estimate": estimate[f"gpu_{key}_bytes"],
                              "llama_cpp": by_part.get(part)}
                       for part, key in (("weights", "weights"), ("kv", "kv_cache"),
                                         ("compute", "compute"))}}  # fmt: skip
    if nvml:
        check["estimate_over_nvml"] = round(estimated / nvml, 4)
        check["within_10_percent_of_nvml"] = abs(estimated - nvml) <= 0.10 * nvml
    if buffers:
        check["estimate_over_buffers"] = round(estimated / buffers, 4)
    return check
