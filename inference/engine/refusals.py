"""One vocabulary of refusals, from the engine to the HTTP status.

Every "no" a request can get, wherever it is said (the engine, the host, a runner process, the
supervisor, a split-mode worker), is a `Refused` with one `RefusalKind`. Subclasses name where
it arose (QueueFull, PromptTooLong, ...) and fix their kind, so code can still catch one
condition; but across a process boundary (the runner channel, Redis) a refusal travels as data,
a `Refusal`, and comes back as a `Refused` of the same kind. Nothing between the place that
refuses and the API edge maps one name to another: the API turns a kind into a status in one
table (dashboard.api.errors).
"""

from dataclasses import dataclass
from enum import StrEnum


class RefusalKind(StrEnum):
    INVALID = "invalid"  # a request field out of bounds (the field is named): 400
    TOO_LONG = "too_long"  # the prompt does not fit the context: 400
    BUSY = "busy"  # a full queue, a model answering, a worker that did not take it: 429
    UNAVAILABLE = "unavailable"  # the engine stopped, a runner died or backs off, no worker: 503
    LOAD_FAILED = "load_failed"  # the model could not be loaded: 503
    NO_MEMORY = "no_memory"  # the model (or its context) does not fit free memory: 507
    FAILED = "failed"  # the request broke while it ran: 500


@dataclass(slots=True, frozen=True)
class Refusal:
    """A refusal as data: what crosses the runner channel and Redis."""

    kind: RefusalKind
    message: str
    field: str | None = None  # the request field at fault, for kind "invalid"

    def error(self) -> "Refused":
        return Refused(self.message, kind=self.kind, field=self.field)

    def event(self, request_id: str) -> dict:
        """The error event a refused or failed request ends with (inference.engine.events)."""
        event = {"type": "error", "request_id": request_id, "code": str(self.kind),
                 "message": self.message, "figures": {}}  # fmt: skip
        if self.field is not None:
            event["field"] = self.field
        return event


class Refused(Exception):
    """A request that cannot be served, and why (`kind`)."""

    kind: RefusalKind = RefusalKind.FAILED

    def __init__(self, message: str, *, kind: RefusalKind | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = RefusalKind(kind)
        self.field = field

    @property
    def refusal(self) -> Refusal:
        return Refusal(self.kind, self.message, self.field)

    @classmethod
    def of(cls, exc: BaseException, fallback: RefusalKind = RefusalKind.FAILED) -> "Refused":
        """Any exception as a refusal: a Refused as it is, anything else of kind `fallback`."""
        if isinstance(exc, Refused):
            return exc
        return cls(str(exc) or type(exc).__name__, kind=fallback)


def error_event(request_id: str, kind: RefusalKind, message: str) -> dict:
    """The error event of a refusal said on the spot (a worker gone, a malformed payload)."""
    return Refusal(kind, message).event(request_id)
