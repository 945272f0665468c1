"""The telemetry snapshot of one inference worker (what the dashboard and /metrics read), and
how it reaches the dashboards: one message per worker per interval on the channel-layer group
TELEMETRY_GROUP, which every dashboard socket joins (dashboard.web.telemetry). Whoever holds the
engines publishes: the web process when embedded, each inference worker in split mode.
"""

import time

from inference.engine.host import EngineHost
from inference.planning.machine import system_readings
from inference.serving.supervisor import RunnerSupervisor


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


TELEMETRY_GROUP = "telemetry"
TELEMETRY_MESSAGE = "telemetry.snapshot"  # the consumers' handler: telemetry_snapshot


async def publish(layer, snapshot: dict) -> None:
    """Send one worker's snapshot to every dashboard socket."""
    await layer.group_send(TELEMETRY_GROUP, {"type": TELEMETRY_MESSAGE, "snapshot": snapshot})
