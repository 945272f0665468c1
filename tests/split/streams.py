"""Driving SplitClient streams in tests: prompts, and reading with a deadline (a hang fails the
test instead of freezing the suite)."""

import asyncio

from inference.engine import GenerationRequest, SamplingParams

STREAM_TIMEOUT_S = 180  # a first request loads the model; the 2-core box is shared


def chat_prompt(text: str) -> str:
    """SmolLM2's ChatML, written out: these tests exercise transport, not templates."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def counting(max_tokens: int = 300, **params) -> GenerationRequest:
    """A request that keeps generating until stopped: counting never runs out of numbers."""
    prompt = "Count from 1 to 1000, separated by commas: 1, 2, 3, 4, 5,"
    params = SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, **params})
    return GenerationRequest(prompt, params, model="smollm2-135m-instruct")


def short(text: str = "Say hello.", max_tokens: int = 12) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return GenerationRequest(chat_prompt(text), params, model="smollm2-135m-instruct")


async def collect(client, generation, spec, *, timeout: float = STREAM_TIMEOUT_S, on_event=None):
    """Every event of one stream, up to and including the final one."""
    events = []
    async with asyncio.timeout(timeout):
        async for event in client.stream(generation, spec):
            events.append(event)
            if on_event is not None:
                await on_event(event, events)
    return events


def tokens(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "token"]


async def eventually(predicate, timeout: float = 60.0, interval: float = 0.2) -> bool:
    """Poll a (sync) predicate until it holds: a deadline, never a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(interval)
    return await asyncio.to_thread(predicate)
