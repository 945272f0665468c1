"""A request's measured figures (the README's "The figures") in each dialect's own words.

Every value is read from the engine's figures; none is derived from another (Ollama's
eval_duration is the measured decode span, not total minus the rest), so the API reports what
the dashboard and /metrics report for the same request.
"""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else int(round(seconds * 1e9))


def decode_span(figures: dict) -> float | None:
    """First output token → end of the answer, from the request's timeline."""
    for phase in figures.get("timeline") or ():
        if phase.get("phase") == "decode":
            return max(0.0, phase["end"] - phase["start"])
    return None


def evaluated_prompt_tokens(figures: dict) -> int:
    """Prompt tokens the prefill computed: those not reused from the KV prefix cache."""
    return max(0, (figures.get("prompt_tokens") or 0) - (figures.get("cached_tokens") or 0))


def openai_usage(figures: dict) -> dict:
    prompt = figures.get("prompt_tokens") or 0
    completion = figures.get("output_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": figures.get("cached_tokens") or 0},
    }


def openai_timings(figures: dict) -> dict:
    """llama-server's `timings` names where they exist, plus the appliance's other figures."""
    itl = figures.get("itl") or {}
    return {
        "prompt_n": evaluated_prompt_tokens(figures),
        "prompt_ms": _ms(figures.get("prefill_time")),
        "prompt_per_second": figures.get("prompt_tps"),
        "predicted_n": figures.get("output_tokens") or 0,
        "predicted_ms": _ms(decode_span(figures)),
        "predicted_per_second": figures.get("decode_tps"),
        "cache_n": figures.get("cached_tokens") or 0,
        "ttft_ms": _ms(figures.get("ttft")),
        "queue_ms": _ms(figures.get("queue_time")),
        "load_ms": _ms(figures.get("load_time")),
        "total_ms": _ms(figures.get("total_time")),
        "itl_ms": {q: _ms(itl.get(q)) for q in ("p50", "p95", "p99", "max")},
    }


def ollama_durations(figures: dict) -> dict:
    """Ollama's final-chunk fields, in nanoseconds."""
    return {
        "total_duration": _ns(figures.get("total_time")),
        "load_duration": _ns(figures.get("load_time")),
        "prompt_eval_count": evaluated_prompt_tokens(figures),
        "prompt_eval_duration": _ns(figures.get("prefill_time")),
        "eval_count": figures.get("output_tokens") or 0,
        "eval_duration": _ns(decode_span(figures)),
    }
