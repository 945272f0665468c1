"""The dashboard's panels, cut from real worker snapshots."""

import json

import pytest

from dashboard.web.panels import panels
from inference.client import get_client


def test_a_real_embedded_snapshot_gives_every_panel():
    snapshot = get_client().snapshots()[0]
    result = panels(snapshot)
    json.dumps(result, allow_nan=False)  # what the socket sends must be strict JSON
    assert result["worker"] == snapshot["worker"]
    assert result["mode"] == "embedded"
    assert result["memory"]["kind"] == ("gpu" if snapshot["system"]["gpus"] else "ram")
    assert result["memory"]["rss_bytes"] == snapshot["system"]["rss_bytes"]


def test_without_a_gpu_the_memory_panel_shows_the_workers_rss_and_model_size():
    memory = panels({"system": {"gpus": [], "rss_bytes": 300, "model_bytes": 100,
                                "ram_total_bytes": 1000}})["memory"]  # fmt: skip
    assert (memory["kind"], memory["rss_bytes"], memory["model_bytes"]) == ("ram", 300, 100)


def test_several_models_add_their_throughput_and_report_their_worst_latency():
    def engine(prompt, output, ttft_p95, kv):
        return {"prompt_tps": prompt, "output_tps": output, "queue_depth": 1,
                "active_sequences": 2, "kv_fill": kv, "outcomes": {"stop": 1},
                "ttft": {"p50": 0.1, "p95": ttft_p95, "p99": None, "max": 1.0},
                "itl": {}}  # fmt: skip

    result = panels({"models": {"a": engine(800.0, 30.0, 0.4, 0.2),
                                "b": engine(100.0, 10.0, 0.9, 0.6)}})  # fmt: skip
    assert (result["prompt_tps"], result["output_tps"]) == (900.0, 40.0)
    assert result["ttft"] == {"p50": 0.1, "p95": 0.9, "p99": None, "max": 1.0}
    assert result["itl"] == {"p50": None, "p95": None, "p99": None, "max": None}
    assert (result["queue_depth"], result["active_sequences"], result["finished"]) == (2, 4, 2)
    assert result["kv_fill"] == 0.6


@pytest.mark.parametrize("junk", [{}, {"models": {"a": "x"}, "system": "y", "loaded": ["z"]},
                                  {"models": {"a": {"prompt_tps": float("nan")}}}])
def test_a_malformed_snapshot_gives_empty_panels_rather_than_an_error(junk):
    result = panels(junk)
    json.dumps(result, allow_nan=False)
    assert result["prompt_tps"] == 0.0
