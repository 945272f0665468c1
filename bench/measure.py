"""Client-side measurements that work on anything with the engine's submit/events interface: an
in-process Engine or a RunnerProcess. No llama_cpp here (a RunnerProcess client imports none)."""

import statistics
import time

from inference.engine import GenerationRequest as ask  # noqa: N813
from inference.engine import SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def client_run(target, prompt, max_tokens: int) -> tuple[object, float, list[float]]:
    """Submit and read the events as a caller does. Returns (done event, the time just before
    submit(), each token event's arrival time at the caller)."""
    submitted = time.perf_counter()
    handle = target.submit(ask(prompt, greedy(max_tokens)))
    times: list[float] = []
    final = None
    for event in handle.events(timeout=600):
        if event.type == "token":
            times.append(time.perf_counter())
        final = event
    if final is None or final.type != "done":
        raise RuntimeError(f"request failed: {getattr(final, 'message', final)}")
    return final, submitted, times


def client_ttfts(target, prompts: list, max_tokens: int = 2) -> list[tuple[float, float]]:
    """Per prompt: (seconds from just before submit() to the first token event received, the
    server's own TTFT figure). The server counts from the arrival the request carries, stamped
    as the caller built it, so the difference is what the first token took to reach the
    caller."""
    out = []
    for prompt in prompts:
        final, submitted, times = client_run(target, prompt, max_tokens)
        out.append((times[0] - submitted, final.figures["ttft"]))
    return out


def client_decode(target, prompt, steps: int) -> dict:
    """`steps` decode intervals as the caller sees them (tokens received / time), and the
    server's own decode tok/s for the same request."""
    final, _, times = client_run(target, prompt, steps + 1)
    if len(times) < 2:
        raise RuntimeError("the answer ended before a second token")
    return {"client_tps": (len(times) - 1) / (times[-1] - times[0]),
            "server_tps": final.figures["decode_tps"], "tokens": len(times)}  # fmt: skip


def client_side(target, args: dict) -> dict:
    """Shared by both IPC sides: warm-up, then client-side TTFT of short prompts and
    client-observed decode tok/s."""
    tokens = args["tokens"]
    client_ttfts(target, [tokens["warm"]], max_tokens=4)
    pairs = client_ttfts(target, [tokens[f"ttft{i}"] for i in range(args["ttft_requests"])])
    ttfts = [client for client, _ in pairs]
    decodes = [client_decode(target, tokens[f"decode{i}"], args["decode_steps"])
               for i in range(args["decode_requests"])]  # fmt: skip
    short = any(d["tokens"] < args["decode_steps"] + 1 for d in decodes)
    return {"ttft_s": statistics.median(ttfts), "ttfts_s": ttfts,
            "delivery_s": statistics.median([client - server for client, server in pairs]),
            "decode_tps": statistics.median([d["client_tps"] for d in decodes]),
            "server_decode_tps": statistics.median([d["server_tps"] for d in decodes]),
            "ended_early": short}  # fmt: skip
