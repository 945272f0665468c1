"""When an HTTP request or a chat frame reached the application: the stamp a generation's clock
starts from.

The gate (appliance.gate) stamps every HTTP request as it arrives, into the ASGI scope
(ARRIVED_WALL, ARRIVED_PERF) and into a context variable that `arrived_wall()` reads, so that
TTFT and queue time count the time before the view got round to the request; the chat socket
stamps each frame it receives the same way (`arrival()`). It imports nothing
from the project: the views that read the stamp and the gate that writes it both depend on this
module, never on each other.
"""

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

ARRIVED_WALL = "appliance.arrived_wall"  # time.time() when the application got the request
ARRIVED_PERF = "appliance.arrived_perf"  # time.perf_counter() at the same moment

_arrived_wall: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "appliance_arrived_wall", default=None
)


def arrived_wall() -> float | None:
    """The wall-clock arrival of the HTTP request or WebSocket frame being handled, or None
    outside one."""
    return _arrived_wall.get()


@contextmanager
def arrival() -> Iterator[None]:
    """Stamp the arrival of what is handled inside (a WebSocket frame), as the gate does for an
    HTTP request; code run from here, in threads too (sync_to_async), reads it."""
    token = _arrived_wall.set(time.time())
    try:
        yield
    finally:
        _arrived_wall.reset(token)


@contextmanager
def stamped(scope: dict) -> Iterator[dict]:
    """The scope with its arrival stamped in, and `arrived_wall()` set while the block runs."""
    wall, perf = time.time(), time.perf_counter()
    token = _arrived_wall.set(wall)
    try:
        yield {**scope, ARRIVED_WALL: wall, ARRIVED_PERF: perf}
    finally:
        _arrived_wall.reset(token)
