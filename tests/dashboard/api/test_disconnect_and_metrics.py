"""A client that leaves mid-stream frees its sequence at once; /metrics parses and moves."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboard.api.ollama.test_client import wait_until
from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

COUNTING = {"model": STARTER, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 600, "temperature": 0}


def samples(http: httpx.Client, headers: dict) -> dict[tuple, float]:
    response = http.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: dict, name: str, **labels) -> float:
    return sum(
        value
        for (sample, pairs), value in found.items()
        if sample == name and set(labels.items()) <= set(pairs)
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {**COUNTING, "stream": True}),
        (
            "/api/generate",
            {
                "model": STARTER,
                "prompt": "1, 2, 3, 4, 5,",
                "raw": True,
                "options": {"num_predict": 600, "temperature": 0},
            },
        ),
    ],
    ids=["openai sse", "ollama ndjson"],
)
def test_a_client_that_disconnects_mid_stream_frees_its_sequence(
    http, appliance, admin_headers, chat_headers, path, body
):
    # A stream an earlier test left is cancelled asynchronously: let it end before counting.
    assert wait_until(lambda: appliance.running_sequences() == 0)
    before = samples(http, admin_headers)
    with httpx.Client(base_url=appliance.url, timeout=120) as client:
        with client.stream("POST", path, json=body, headers=chat_headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6), strict=False) if line]
            assert received
            assert appliance.running_sequences() == 1  # still generating as we leave
        # Leaving the block closed the connection mid-answer.
    assert wait_until(lambda: appliance.running_sequences() == 0)
    after = samples(http, admin_headers)
    cancelled = "appliance_requests_total"
    assert total(after, cancelled, outcome="cancelled") == (
        total(before, cancelled, outcome="cancelled") + 1
    )
    # It was cut short: far fewer tokens than it asked for were generated.
    generated = total(after, "appliance_generation_tokens_total") - total(
        before, "appliance_generation_tokens_total"
    )
    assert 0 < generated < 600


def test_metrics_parse_and_move_after_a_request(http, admin_headers, chat_headers):
    before = samples(http, admin_headers)
    response = http.post(
        "/v1/completions", json={**COUNTING, "max_tokens": 3}, headers=chat_headers
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    after = samples(http, admin_headers)
    labels = {"model": STARTER, "worker": "embedded"}

    def moved(name: str, **more) -> float:
        return total(after, name, **labels, **more) - total(before, name, **labels, **more)

    assert moved("appliance_generation_tokens_total") == usage["completion_tokens"]
    assert (
        moved("appliance_prompt_tokens_total") + moved("appliance_cached_prompt_tokens_total")
        == usage["prompt_tokens"]
    )
    assert moved("appliance_requests_total", outcome="length") == 1
    for histogram in (
        "appliance_time_to_first_token_seconds",
        "appliance_e2e_request_latency_seconds",
        "appliance_request_queue_time_seconds",
        "appliance_request_prefill_time_seconds",
    ):
        assert moved(f"{histogram}_count") == 1
        assert moved(f"{histogram}_bucket", le="+Inf") == 1
    assert moved("appliance_inter_token_latency_seconds_count") == usage["completion_tokens"] - 1
    assert total(after, "appliance_models_loaded") == 1
    assert total(after, "appliance_process_resident_memory_bytes") > 0
    assert 0 <= total(after, "appliance_kv_cache_usage_ratio", **labels) <= 1
    assert ("appliance_requests_waiting", tuple(sorted(labels.items()))) in after
    # Warm memory: the request was admitted once, its cached tokens counted by tier; the RAM
    # tier (on by default, sized from the machine) has its bound; speculation's counters exist.
    tiers = ("resident", "ram", "disk", "miss")
    assert sum(moved("appliance_prompt_cache_admissions_total", tier=t) for t in tiers) == 1
    assert moved("appliance_prompt_cache_reused_tokens_total") == moved(
        "appliance_cached_prompt_tokens_total")  # fmt: skip
    assert total(after, "appliance_prompt_cache_bound_bytes", **labels, tier="ram") > 0
    assert ("appliance_spec_decode_num_drafts_total", tuple(sorted(labels.items()))) in after


def test_metrics_need_a_key_unless_public(http):
    assert http.get("/metrics").status_code == 401
