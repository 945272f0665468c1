"""The telemetry snapshot of one inference worker: what the dashboard and /metrics read."""

import time

from inference.engine.host import EngineHost
from inference.system import system_readings


def worker_snapshot(host: EngineHost, worker: str, *, mode: str) -> dict:
    loaded = host.loaded()
    return {
        "worker": worker,
        "mode": mode,
        "time": time.time(),
        "loading": host.loading,
        "loaded": loaded,
        "models": host.snapshots(),
        "system": system_readings(model_bytes=sum(m["size_bytes"] for m in loaded)),
    }
