"""The telemetry snapshot of one inference worker: what the dashboard and /metrics read."""

import time

from inference.engine.host import EngineHost
from inference.serving.supervisor import RunnerSupervisor
from inference.system import system_readings


def worker_snapshot(
    host: EngineHost, worker: str, *, mode: str, supervisor: RunnerSupervisor | None = None
) -> dict:
    loaded = host.loaded()
    pids = supervisor.pids() if supervisor is not None else ()
    return {
        "worker": worker,
        "mode": mode,
        "time": time.time(),
        "loading": host.loading,
        "loaded": loaded,
        "models": host.snapshots(),
        "runners": supervisor.states() if supervisor is not None else [],
        "system": system_readings(
            model_bytes=sum(m["size_bytes"] for m in loaded), runner_pids=pids
        ),
    }
