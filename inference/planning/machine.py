"""Readings of the box itself: GPUs through NVML, or the process's RSS and CPU without one; and
the one reckoning of free GPU memory (`free_gpu_bytes`) that the load preflight, the
announcements of split mode's workers, the dashboard's Boxes and the model pages share, so that
they cannot disagree about whether a model fits."""

import logging
import os
from functools import cache

import psutil

log = logging.getLogger(__name__)


@cache
def _nvml():
    """The pynvml module, initialised, or None on a box without an NVIDIA GPU or driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no library, no driver or no GPU: all mean "no GPU"
        return None


def visible_gpus(count: int) -> list[int]:
    """The indices of the GPUs llama.cpp may use: NVML sees every GPU, llama.cpp only those
    CUDA_VISIBLE_DEVICES lets through. Only plain indices are understood; anything else (UUIDs)
    counts every GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return list(range(count))
    return [int(p) for p in parts if int(p) < count]


def gpu_readings(pids: set[int] | None = None) -> list[dict]:
    """Per GPU: name, used and total bytes (NVML), whether llama.cpp may use it (`visible`), and
    the share of `pids` (default: this process; the inference worker passes itself and its
    runner processes)."""
    nvml = _nvml()
    if nvml is None:
        return []
    pids = pids or {os.getpid()}
    gpus = []
    try:
        count = nvml.nvmlDeviceGetCount()
        visible = set(visible_gpus(count))
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            own = 0
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle) or []:
                if proc.pid in pids and proc.usedGpuMemory:
                    own += proc.usedGpuMemory
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "used_bytes": int(memory.used),
                "total_bytes": int(memory.total),
                "process_bytes": int(own),
                "utilization": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                "visible": index in visible,
            })  # fmt: skip
    except Exception:  # noqa: BLE001 - a driver hiccup must not break the dashboard
        log.exception("NVML reading failed")
    return gpus


def free_gpu_bytes(gpus: list[dict]) -> int | None:
    """Free memory on the GPUs llama.cpp may use, from readings (gpu_readings: this box's, or a
    worker's as its snapshot carries them); None without such a GPU. The one definition: the
    preflight, the workers' announcements and the model pages all count free GPU memory here."""
    usable = [g for g in gpus if g.get("visible", True)]
    if not usable:
        return None
    return sum(max(0, g["total_bytes"] - g["used_bytes"]) for g in usable)


def free_ram_bytes() -> int | None:
    try:
        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no /proc: unknown rather than a crash
        return None


_process = psutil.Process()


def _rss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:  # a runner that just ended
        return 0


def system_readings(model_bytes: int = 0, runner_pids: tuple[int, ...] = ()) -> dict:
    """What the memory and CPU panels show; `model_bytes` is the mmap'd size of loaded models,
    `runner_pids` the runner processes whose memory counts as the worker's."""
    memory = psutil.virtual_memory()
    runners_rss = sum(_rss(pid) for pid in runner_pids)
    return {
        "gpus": gpu_readings({os.getpid(), *runner_pids}),
        "rss_bytes": _process.memory_info().rss + runners_rss,
        "runners_rss_bytes": runners_rss,
        "model_bytes": model_bytes,
        "ram_total_bytes": memory.total,
        "ram_available_bytes": memory.available,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "cpu_count": psutil.cpu_count(),
    }
