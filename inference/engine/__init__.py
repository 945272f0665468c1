"""The inference engine: phase-aware continuous batching on llama.cpp. Imports no Django.

Public interface:
    Engine(runner, itl_target=0.1, background_itl_target=1.0, max_queue=64).start()
    engine.submit(GenerationRequest(prompt, SamplingParams(...), cache_key=...)) -> RequestHandle
    handle.events() / handle.aevents() -> TokenEvent, PhaseEvent, QueueEvent, PrefillEvent,
                                          PausedEvent, DoneEvent, ErrorEvent
    engine.cancel(request_id); engine.set_priority(request_id, "background")
    engine.snapshot(); engine.shutdown()
    engine.embed(["text", [token ids]], truncate=True) -> Future of an embedding.Embedding
Every refusal is a Refused with a RefusalKind (inference.engine.refusals).
Only runner.py imports llama_cpp; load it with `inference.engine.runner.LlamaRunner`.
"""

from inference.engine.engine import Engine, EngineStopped, PromptTooLong, QueueFull
from inference.engine.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    PausedEvent,
    PhaseEvent,
    PrefillEvent,
    QueueEvent,
    RequestHandle,
    TokenEvent,
    event_to_dict,
)
from inference.engine.generation import GenerationRequest
from inference.engine.params import InvalidParams, SamplingParams
from inference.engine.refusals import Refusal, RefusalKind, Refused

__all__ = [
    "DoneEvent", "Engine", "EngineStopped", "ErrorEvent", "Event", "GenerationRequest",
    "InvalidParams", "PausedEvent", "PhaseEvent", "PrefillEvent", "PromptTooLong", "QueueEvent",
    "QueueFull", "Refusal", "RefusalKind", "Refused", "RequestHandle", "SamplingParams",
    "TokenEvent", "event_to_dict",
]  # fmt: skip
