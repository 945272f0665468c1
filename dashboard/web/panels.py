"""What the live dashboard shows, cut from one inference worker's telemetry snapshot.

A snapshot (inference.serving.feed.worker_snapshot) carries every engine's full telemetry,
Prometheus histograms included, and every runner process's state; the browser needs a few numbers
per panel, a few times a second.
"""

import math
from typing import TypedDict

# RunnerState["state"] (inference.serving.supervisor); anything else from a snapshot is shown as
# "unknown" rather than trusted as text for the page.
RUNNER_STATES = frozenset({"starting", "running", "stopped", "crashed", "backing off", "failed"})


class Distribution(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class ModelPanel(TypedDict):
    prompt_tps: float
    output_tps: float
    ttft: Distribution
    itl: Distribution
    queue_depth: int
    active_sequences: int
    prefilling: int
    decoding: int
    slots: int
    kv_fill: float
    kv_used: int
    kv_size: int
    token_budget: int | None
    itl_target: float | None
    finished: int  # requests ended since the model loaded, any outcome: the table refreshes on it


class GpuPanel(TypedDict):
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    process_bytes: int
    utilization: float | None


class MemoryPanel(TypedDict):
    kind: str  # "gpu": NVML per GPU; "ram": no GPU, the worker's RSS and the models' size
    gpus: list[GpuPanel]
    rss_bytes: int  # the worker's RSS with its runner processes'
    runners_rss_bytes: int  # the runner processes' share of it
    model_bytes: int
    ram_total_bytes: int | None
    ram_available_bytes: int | None


class RunnerPanel(TypedDict):
    """One model's runner process (inference.serving.supervisor.RunnerState), as the table
    shows it."""

    model: str
    state: str
    pid: int | None
    restarts: int
    crashes_in_a_row: int
    last_exit: str | None
    # Seconds from the last exit to the snapshot, both on the worker's clock: the browser's
    # clock may be off from the worker's, so it only adds the time since the snapshot arrived.
    last_exit_ago: float | None
    retry_in: float | None  # seconds until a restart is allowed, as of the snapshot
    extra_bufts: bool
    note: str


class Panels(TypedDict):
    worker: str
    mode: str
    time: float
    loading: str | None
    loaded: list[dict]
    prompt_tps: float
    output_tps: float
    ttft: Distribution
    itl: Distribution
    queue_depth: int
    active_sequences: int
    kv_fill: float
    finished: int
    cpu_percent: float | None
    cpu_count: int | None
    memory: MemoryPanel
    models: dict[str, ModelPanel]
    runners: list[RunnerPanel]


def _number(value, default=0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _int(value) -> int:
    return int(_number(value, 0))


def _distribution(raw) -> Distribution:
    raw = raw if isinstance(raw, dict) else {}
    return {
        key: (_number(raw.get(key)) if raw.get(key) is not None else None)
        for key in ("p50", "p95", "p99", "max")
    }  # type: ignore[return-value]


def _worst(distributions: list[Distribution]) -> Distribution:
    """With several models loaded, each percentile's worst value: the one a user can feel."""
    worst: Distribution = {"p50": None, "p95": None, "p99": None, "max": None}
    for dist in distributions:
        for key, value in dist.items():
            if value is not None and (worst[key] is None or value > worst[key]):
                worst[key] = value
    return worst


def model_panel(snapshot: dict) -> ModelPanel:
    return {
        "prompt_tps": _number(snapshot.get("prompt_tps")),
        "output_tps": _number(snapshot.get("output_tps")),
        "ttft": _distribution(snapshot.get("ttft")),
        "itl": _distribution(snapshot.get("itl")),
        "queue_depth": _int(snapshot.get("queue_depth")),
        "active_sequences": _int(snapshot.get("active_sequences")),
        "prefilling": _int(snapshot.get("prefilling")),
        "decoding": _int(snapshot.get("decoding")),
        "slots": _int(snapshot.get("slots")),
        "kv_fill": _number(snapshot.get("kv_fill")),
        "kv_used": _int(snapshot.get("kv_used")),
        "kv_size": _int(snapshot.get("kv_size")),
        "token_budget": _int(snapshot["token_budget"]) if "token_budget" in snapshot else None,
        "itl_target": _number(snapshot.get("itl_target"), None),
        "finished": sum(_int(v) for v in (snapshot.get("outcomes") or {}).values()),
    }


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def runner_panel(raw: dict, snapshot_time: float) -> RunnerPanel:
    state = raw.get("state")
    pid = raw.get("pid")
    exit_at = _number(raw.get("last_exit_at"), None)
    retry_in = _number(raw.get("retry_in"), None)
    return {
        "model": _text(raw.get("model")) or "",
        "state": state if isinstance(state, str) and state in RUNNER_STATES else "unknown",
        "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        "restarts": _int(raw.get("restarts")),
        "crashes_in_a_row": _int(raw.get("crashes_in_a_row")),
        "last_exit": _text(raw.get("last_exit")),
        "last_exit_ago": (
            max(0.0, snapshot_time - exit_at) if exit_at is not None and snapshot_time else None
        ),
        "retry_in": retry_in if retry_in is not None and retry_in > 0 else None,
        "extra_bufts": raw.get("extra_bufts") is not False,
        "note": _text(raw.get("note")) or "",
    }


def memory_panel(system: dict) -> MemoryPanel:
    gpus: list[GpuPanel] = [
        {
            "index": _int(gpu.get("index")),
            "name": str(gpu.get("name") or f"GPU {gpu.get('index', '?')}"),
            "used_bytes": _int(gpu.get("used_bytes")),
            "total_bytes": _int(gpu.get("total_bytes")),
            "process_bytes": _int(gpu.get("process_bytes")),
            "utilization": _number(gpu.get("utilization"), None),
        }
        for gpu in system.get("gpus") or []
        if isinstance(gpu, dict)
    ]
    return {
        "kind": "gpu" if gpus else "ram",
        "gpus": gpus,
        "rss_bytes": _int(system.get("rss_bytes")),
        "runners_rss_bytes": _int(system.get("runners_rss_bytes")),
        "model_bytes": _int(system.get("model_bytes")),
        "ram_total_bytes": _int(system["ram_total_bytes"]) if "ram_total_bytes" in system else None,
        "ram_available_bytes": (
            _int(system["ram_available_bytes"]) if "ram_available_bytes" in system else None
        ),
    }


def panels(snapshot: dict) -> Panels:
    """The dashboard's panels for one worker: engine figures summed over its loaded models
    (throughput, queue, sequences), latencies at their worst, the box's memory and CPU, and
    its runner processes."""
    models = {
        str(name): model_panel(snap)
        for name, snap in (snapshot.get("models") or {}).items()
        if isinstance(snap, dict)
    }
    system = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    loaded = [
        {"name": str(row.get("name")), "size_bytes": _int(row.get("size_bytes")),
         "busy": bool(row.get("busy")), "expires_in": _number(row.get("expires_in"), None)}
        for row in snapshot.get("loaded") or []
        if isinstance(row, dict)
    ]  # fmt: skip
    time = _number(snapshot.get("time"))
    raw_runners = snapshot.get("runners")
    runners = [
        runner_panel(row, time)
        for row in (raw_runners if isinstance(raw_runners, list) else [])
        if isinstance(row, dict) and _text(row.get("model"))
    ]
    return {
        "worker": str(snapshot.get("worker") or ""),
        "mode": str(snapshot.get("mode") or ""),
        "time": time,
        "loading": snapshot.get("loading") if isinstance(snapshot.get("loading"), str) else None,
        "loaded": loaded,
        "prompt_tps": sum(m["prompt_tps"] for m in models.values()),
        "output_tps": sum(m["output_tps"] for m in models.values()),
        "ttft": _worst([m["ttft"] for m in models.values()]),
        "itl": _worst([m["itl"] for m in models.values()]),
        "queue_depth": sum(m["queue_depth"] for m in models.values()),
        "active_sequences": sum(m["active_sequences"] for m in models.values()),
        "kv_fill": max((m["kv_fill"] for m in models.values()), default=0.0),
        "finished": sum(m["finished"] for m in models.values()),
        "cpu_percent": _number(system.get("cpu_percent"), None),
        "cpu_count": _int(system["cpu_count"]) if system.get("cpu_count") else None,
        "memory": memory_panel(system),
        "models": models,
        "runners": sorted(runners, key=lambda r: r["model"]),
    }
