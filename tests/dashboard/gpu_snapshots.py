"""A worker's telemetry snapshot as it comes from a box with NVIDIA cards: its system readings
through a fake NVML (tests.inference.planning.nvml), one runner process with a model whose info
says what a CUDA build of llama.cpp allocated for it (tests.inference.engine.test_buffers)."""

from inference.engine.buffers import gpu_split, read_load_log
from inference.planning.machine import system_readings
from tests.inference.engine.test_buffers import CPU_LOAD, CUDA_LOAD
from tests.inference.planning.nvml import installed

RUNNER = 4242
MODEL = "smollm2-1.7b"


def runner_info(*, cuda: bool) -> dict:
    load = read_load_log(CUDA_LOAD if cuda else CPU_LOAD)
    return {"gpu_offload": cuda, "buffers": load["buffers"],
            "gpu_buffers": gpu_split(load["buffers"]), "gpu_layers": load["gpu_layers"],
            "layers": load["layers"], "size_bytes": 1 << 30}  # fmt: skip


def worker_snapshot(monkeypatch, *cards, cuda: bool = True, worker: str = "nas") -> dict:
    """The snapshot a worker on a box with `cards` (none: no GPU) sends, one model loaded."""
    installed(monkeypatch, *cards)
    return {
        "worker": worker, "mode": "embedded", "time": 100.0, "loading": None,
        "loaded": [{"name": MODEL, "size_bytes": 1 << 30}],
        "models": {MODEL: {"model": runner_info(cuda=cuda)}},
        "runners": [{"model": MODEL, "state": "running", "pid": RUNNER, "restarts": 0}],
        "system": system_readings(model_bytes=1 << 30, runner_pids=(RUNNER,)),
    }  # fmt: skip
