"""How the served benchmarks count (bench/http_load.py, bench/versus_server.py, bench/servers.py):
tokens by the servers' own counts, the clients' figures and the frontier from canned rows, and
every appliance measurement read cold. No server runs here."""

import math
import os

import pytest

from bench.http_load import Answer, tokens_within, window_figures
from bench.servers import Appliance
from bench.versus_server import frontier_table, summarize_clients


def answer(times: list[float], tokens: int | None) -> Answer:
    return Answer(0.0, first=times[0], token_times=times, completion_tokens=tokens,
                  complete=tokens is not None)  # fmt: skip


def test_a_chunk_that_carries_several_tokens_counts_them_all():
    # Speculation kept a draft: 12 tokens came in 4 chunks; llama-server sends one a chunk.
    drafted, plain = answer([1.0, 2.0, 3.0, 4.0], 12), answer([1.0, 2.0], 2)
    assert tokens_within([drafted, plain], 0.0, 10.0) == 14
    assert tokens_within([drafted], 2.5, 10.0) == 6  # two of its chunks inside: half its tokens


def test_an_answer_cut_off_before_its_usage_counts_at_the_usual_tokens_per_chunk():
    ended = answer([1.0, 2.0], 6)  # 3 tokens a chunk
    cut = answer([5.0, 6.0, 7.0], None)
    assert tokens_within([ended, cut], 0.0, 10.0) == 6 + 9
    assert tokens_within([cut], 0.0, 10.0) == 3  # nothing ended: a chunk is a token


def row(output: float, ttft: float, itl: float, person_ttft: float, person_itl: float) -> dict:
    return {"output_tps": output, "ttft_p50_s": ttft, "itl_p99_s": itl,
            "person_ttft_p50_s": person_ttft, "person_itl_p99_s": person_itl}  # fmt: skip


def test_the_clients_figures_are_ratios_of_medians_measured_in_the_same_run():
    rows = {("appliance_spec_auto", "clients8"): [row(60, 1.0, 0.10, 0.2, 0.09),
                                                  row(70, 2.0, 0.12, 0.3, 0.11),
                                                  row(65, 1.5, 0.11, 0.25, 0.10)],
            ("appliance_spec_off", "clients8"): [row(64, 1.4, 0.1, 0.2, 0.1)],
            ("llama-server", "clients8"): [row(50, 3.0, 0.5, 2.0, 0.4)]}  # fmt: skip
    results: dict = {}
    summarize_clients(rows, results, [8])
    assert results["clients8_output_ratio"] == pytest.approx(65 / 50)
    assert results["clients8_speculation_ratio"] == pytest.approx(65 / 64)
    assert results["clients8_ttft_ratio"] == pytest.approx(1.5 / 3.0)
    assert results["clients8_itl_p99_ms"] == pytest.approx(110)
    assert results["clients8_person_ttft_s"] == pytest.approx(0.25)
    assert results["clients8_person_itl_p99_llama_server_ms"] == pytest.approx(400)


def test_a_side_the_run_did_not_measure_reads_as_not_a_number_not_as_a_figure():
    results: dict = {}
    summarize_clients({}, results, [16])
    assert math.isnan(results["clients16_output_ratio"])


def test_the_frontier_has_a_row_per_measured_side_in_the_order_given():
    sides = [("appliance_itl_100", None, {}), ("appliance_itl_150", None, {}),
             ("llama-server_np_4", None, {})]  # fmt: skip
    rows = {("appliance_itl_150", "frontier8"): [row(66.6, 1.18, 0.159, 0, 0)],
            ("appliance_itl_100", "frontier8"): [row(57.6, 1.91, 0.113, 0, 0)]}  # fmt: skip
    assert frontier_table(rows, sides) == [
        {"side": "appliance_itl_100", "output_tps": 57.6, "ttft_p50_s": 1.91, "itl_p99_ms": 113.0},
        {"side": "appliance_itl_150", "output_tps": 66.6, "ttft_p50_s": 1.18, "itl_p99_ms": 159.0},
    ]


def test_every_appliance_measurement_reads_cold():
    appliance = Appliance(2)
    try:
        os.makedirs(appliance.data.name + "/kv-cache/embedded")
        appliance.forget_kept_prompts()
        assert not os.path.exists(appliance.data.name + "/kv-cache")
        assert os.path.isdir(appliance.data.name)  # the rest of its data stays
    finally:
        appliance.data.cleanup()


def test_a_windows_figures_count_what_ended_and_what_came_inside_it():
    ended = answer([1.0, 1.5, 2.0], 3)  # ended inside the window
    cut = Answer(0.5, first=9.0, token_times=[9.0, 11.0])  # cut off by its end
    failed = Answer(0.5, error="HTTP 500")
    figures = window_figures([ended, cut, failed], 0.0, 10.0)
    assert figures["requests_done"] == 1 and figures["errors"] == 1
    assert figures["output_tps"] == pytest.approx((3 + 1) / 10.0)  # the cut one's token inside
    assert figures["ttft_p50_s"] == pytest.approx((1.0 + 8.5) / 2)
    assert figures["itl_p99_s"] == pytest.approx(0.5)  # the gap that ended after it is left out
