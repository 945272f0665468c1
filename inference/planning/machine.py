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
    """Per GPU: name, used and total bytes (NVML), whether llama.cpp may use it (`visible`),
    the share of `pids` (default: this process; the inference worker passes itself and its
    runner processes) in all (`process_bytes`) and per process (`processes`: those of `pids`
    that hold memory there, by pid; `bytes` None where NVML cannot say, as in some containers),
    and the card's load: utilization (%), temperature (°C), power draw and limit (W), each None
    where the card does not report it. No GPU, no NVML: an empty list, never zeros."""
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
            ours = _processes(nvml, handle, pids)
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "used_bytes": int(memory.used),
                "total_bytes": int(memory.total),
                "process_bytes": sum(p["bytes"] or 0 for p in ours),
                "processes": ours,
                "visible": index in visible,
                **_load(nvml, handle),
            })  # fmt: skip
    except Exception:  # noqa: BLE001 - a driver hiccup must not break the dashboard
        log.exception("NVML reading failed")
    return gpus


def _processes(nvml, handle, pids: set[int]) -> list[dict]:
    """The processes of `pids` with memory on this GPU, by pid (one process may be listed
    more than once: NVML lists compute and graphics contexts apart)."""
    found: dict[int, int | None] = {}
    for proc in _optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
        if proc.pid not in pids:
            continue
        used = proc.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE (no per-process accounting)
        if used is not None:
            found[proc.pid] = (found.get(proc.pid) or 0) + int(used)
        else:
            found.setdefault(proc.pid, None)
    return [{"pid": pid, "bytes": used} for pid, used in sorted(found.items())]


def _load(nvml, handle) -> dict:
    utilization = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
    temperature = _optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    power = _optional(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
    limit = _optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    return {
        "utilization": None if utilization is None else utilization.gpu,
        "temperature_c": temperature,
        "power_w": None if power is None else power / 1000,
        "power_limit_w": None if limit is None else limit / 1000,
    }


def _optional(read, *args):
    """One NVML reading, or None where the card or driver does not offer it (a laptop GPU
    without power readings, a container without per-process accounting)."""
    try:
        return read(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: not reported
        return None


def usable_gpus(gpus: list[dict]) -> list[dict]:
    """The readings of the GPUs llama.cpp may use (CUDA_VISIBLE_DEVICES: gpu_readings)."""
    return [g for g in gpus if g.get("visible", True)]


def free_gpu_bytes(gpus: list[dict]) -> int | None:
    """Free memory on the GPUs llama.cpp may use, from readings (gpu_readings: this box's, or a
    worker's as its snapshot carries them); None without such a GPU. The one definition: the
    preflight, the workers' announcements and the model pages all count free GPU memory here."""
    usable = usable_gpus(gpus)
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
