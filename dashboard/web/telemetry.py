"""Telemetry to the channel-layer group "telemetry", which every dashboard socket joins.

Message on the group: {"type": "telemetry.snapshot", "snapshot": <one worker's snapshot>}
(inference.serving.feed.worker_snapshot), one message per worker per interval.

In split mode each inference worker publishes its own snapshots from its own process. In
embedded mode the engine lives here, so one asyncio task per event loop publishes while at least
one dashboard socket on that loop is open, and stops when the last one closes: reading the
snapshot (NVML, psutil) costs something, and nobody needs it with no dashboard open.
"""

import asyncio
import logging
import weakref

from channels.layers import get_channel_layer
from django.conf import settings

from inference.serving.client import get_client

log = logging.getLogger(__name__)

GROUP = "telemetry"
MESSAGE_TYPE = "telemetry.snapshot"


class _Publisher:
    def __init__(self) -> None:
        self.subscribers = 0
        self.task: asyncio.Task | None = None


_publishers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Publisher]" = (
    weakref.WeakKeyDictionary()
)


def publishes_here() -> bool:
    """Only where the engine is in this process; in split mode the workers publish."""
    return not settings.SPLIT_MODE


def subscribe() -> None:
    """A dashboard socket opened on this loop: make sure snapshots flow."""
    if not publishes_here():
        return
    loop = asyncio.get_running_loop()
    publisher = _publishers.setdefault(loop, _Publisher())
    publisher.subscribers += 1
    if publisher.task is None or publisher.task.done():
        publisher.task = loop.create_task(_publish(publisher), name="telemetry-publisher")


def unsubscribe() -> None:
    if not publishes_here():
        return
    publisher = _publishers.get(asyncio.get_running_loop())
    if publisher is None:
        return
    publisher.subscribers = max(0, publisher.subscribers - 1)
    if publisher.subscribers == 0 and publisher.task is not None:
        publisher.task.cancel()
        publisher.task = None


async def publish_once() -> int:
    """Send every worker snapshot of this process to the group; returns how many."""
    snapshots = await asyncio.to_thread(get_client().snapshots)
    layer = get_channel_layer()
    for snapshot in snapshots:
        await layer.group_send(GROUP, {"type": MESSAGE_TYPE, "snapshot": snapshot})
    return len(snapshots)


async def _publish(publisher: _Publisher) -> None:
    while publisher.subscribers > 0:
        try:
            await publish_once()
        except Exception:  # noqa: BLE001 - a failed reading must not stop the live panels
            log.exception("publishing telemetry failed")
        await asyncio.sleep(settings.TELEMETRY_INTERVAL_S)
