"""Telemetry to the dashboards' channel-layer group (inference.serving.feed: one message per
worker per interval), from this process when its inference client says it holds the engines
(`publishes_telemetry`: embedded mode; in split mode each inference worker publishes its own).

Here one asyncio task per event loop publishes while at least one dashboard socket on that loop
is open, and stops when the last one closes: reading the snapshot (NVML, psutil) costs
something, and nobody needs it with no dashboard open.
"""

import asyncio
import logging
import weakref

from channels.layers import get_channel_layer
from django.conf import settings

from inference.serving.client import get_client
from inference.serving.feed import publish

log = logging.getLogger(__name__)



class _Publisher:
    def __init__(self) -> None:
        self.subscribers = 0
        self.task: asyncio.Task | None = None


_publishers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Publisher]" = (
    weakref.WeakKeyDictionary()
)


def publishes_here() -> bool:
    """Only where the engines are in this process."""
    return get_client().publishes_telemetry


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
        await publish(layer, snapshot)
    return len(snapshots)


async def _publish(publisher: _Publisher) -> None:
    while publisher.subscribers > 0:
        try:
            await publish_once()
        except Exception:  # noqa: BLE001 - a failed reading must not stop the live panels
            log.exception("publishing telemetry failed")
        await asyncio.sleep(settings.TELEMETRY_INTERVAL_S)
