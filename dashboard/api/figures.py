"""An answer's figures (the README's "The figures") in each dialect's own words.

`figures` is one answer's dict, as dashboard.api.pipeline.Ending carries it: the engine's (its
DoneEvent's), with the TTFT measured at the wire when the answer streamed (dashboard.wire) and
what the pipeline counted itself (`reasoning_tokens`, the tokens of the thinking). Every value
is read from there; none is derived from another (Ollama's eval_duration is the measured decode
span, not total minus the rest), so the API reports what the dashboard and /metrics report for
the same request.

`timings()` is the one place for a per-answer figure: every dialect's final object carries its
result (OpenAI's chat and completions, the Responses API, Anthropic's Messages and Ollama's last
line, as `timings`), so a figure added there reaches every dialect at once. The usage objects
below are each protocol's own fixed fields, for its clients to read.
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


def timings(figures: dict) -> dict:
    """The answer's figures as every dialect carries them (`timings`): llama-server's names
    where they exist, plus the appliance's other figures. A new per-answer figure goes here."""
    itl = figures.get("itl") or {}
    return {
        "prompt_n": evaluated_prompt_tokens(figures),
        "prompt_ms": _ms(figures.get("prefill_time")),
        "prompt_per_second": figures.get("prompt_tps"),
        "predicted_n": figures.get("output_tokens") or 0,
        "predicted_ms": _ms(decode_span(figures)),
        "predicted_per_second": figures.get("decode_tps"),
        "reasoning_n": figures.get("reasoning_tokens") or 0,  # of predicted_n, the thinking's
        "cache_n": figures.get("cached_tokens") or 0,
        # Of cache_n, by where the KV came from (warm memory: inference.engine.tiers): a
        # resident sequence slot, the RAM tier, the disk tier; and what restoring it took.
        **{f"cache_n_{tier}": (figures.get("cached_by_tier") or {}).get(tier, 0)
           for tier in ("resident", "ram", "disk")},
        "restore_ms": _ms(figures.get("restore_time")) or 0.0,
        # Speculative decoding (inference.engine.speculation), by llama-server's names: the
        # drafted tokens verified for this answer, and of those, the ones kept.
        "draft_n": figures.get("drafted") or 0,
        "draft_n_accepted": figures.get("draft_accepted") or 0,
        # Reading its images (inference.engine.vision), a phase before its prefill: the
        # seconds it took and the image tokens it added (of prompt_n's prompt); 0 for text.
        "encode_ms": _ms(figures.get("encode_time")) or 0.0,
        "image_n": figures.get("image_tokens") or 0,
        "ttft_ms": _ms(figures.get("ttft")),
        "queue_ms": _ms(figures.get("queue_time")),
        "load_ms": _ms(figures.get("load_time")),
        "total_ms": _ms(figures.get("total_time")),
        "itl_ms": {q: _ms(itl.get(q)) for q in ("p50", "p95", "p99", "max")},
    }


def openai_usage(figures: dict) -> dict:
    """Chat and completions' usage."""
    prompt = figures.get("prompt_tokens") or 0
    completion = figures.get("output_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": figures.get("cached_tokens") or 0},
    }


def responses_usage(figures: dict) -> dict:
    """The Responses API's usage; the prompt tokens the prefill computed are what it wrote to
    the prefix cache (cache_write_tokens), those it reused are cached_tokens."""
    prompt = figures.get("prompt_tokens") or 0
    output = figures.get("output_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": figures.get("cached_tokens") or 0,
            "cache_write_tokens": evaluated_prompt_tokens(figures),
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": min(figures.get("reasoning_tokens") or 0, output),
        },
        "total_tokens": prompt + output,
    }


def anthropic_usage(figures: dict) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens the prefill computed, and
    cache_read_input_tokens those reused from the prefix cache (their sum is the prompt)."""
    return {"input_tokens": evaluated_prompt_tokens(figures),
            "output_tokens": figures.get("output_tokens") or 0,
            "cache_read_input_tokens": figures.get("cached_tokens") or 0,
            "cache_creation_input_tokens": 0}  # fmt: skip


def ollama_durations(figures: dict) -> dict:
    """Ollama's last-line fields, in nanoseconds."""
    return {
        "total_duration": _ns(figures.get("total_time")),
        "load_duration": _ns(figures.get("load_time")),
        "prompt_eval_count": evaluated_prompt_tokens(figures),
        "prompt_eval_duration": _ns(figures.get("prefill_time")),
        "eval_count": figures.get("output_tokens") or 0,
        "eval_duration": _ns(decode_span(figures)),
    }
