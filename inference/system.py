"""Readings of the box itself: GPUs through NVML, or the process's RSS and CPU without one."""

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


def gpu_readings(pid: int | None = None) -> list[dict]:
    """Per GPU: name, used and total bytes (NVML), and this process's own share."""
    nvml = _nvml()
    if nvml is None:
        return []
    pid = pid or os.getpid()
    gpus = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            own = 0
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle) or []:
                if proc.pid == pid and proc.usedGpuMemory:
                    own += proc.usedGpuMemory
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "used_bytes": int(memory.used),
                "total_bytes": int(memory.total),
                "process_bytes": int(own),
                "utilization": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            })  # fmt: skip
    except Exception:  # noqa: BLE001 - a driver hiccup must not break the dashboard
        log.exception("NVML reading failed")
    return gpus


_process = psutil.Process()


def system_readings(model_bytes: int = 0) -> dict:
    """What the memory and CPU panels show; `model_bytes` is the mmap'd size of loaded models."""
    memory = psutil.virtual_memory()
    return {
        "gpus": gpu_readings(),
        "rss_bytes": _process.memory_info().rss,
        "model_bytes": model_bytes,
        "ram_total_bytes": memory.total,
        "ram_available_bytes": memory.available,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "cpu_count": psutil.cpu_count(),
    }
