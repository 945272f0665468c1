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


def gpu_readings(pids: set[int] | None = None) -> list[dict]:
    """Per GPU: name, used and total bytes (NVML), and the share of `pids` (default: this
    process; the inference worker passes itself and its runner processes)."""
    nvml = _nvml()
    if nvml is None:
        return []
    pids = pids or {os.getpid()}
    gpus = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
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
            })  # fmt: skip
    except Exception:  # noqa: BLE001 - a driver hiccup must not break the dashboard
        log.exception("NVML reading failed")
    return gpus


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
