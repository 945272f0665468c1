"""FirstOutput: an answer's TTFT from its first output handed to the transport."""

import time

from dashboard.wire import FirstOutput

FIGURES = {"ttft": 0.05, "prefill_time": 0.04, "output_tokens": 3}


def test_nothing_sent_keeps_the_engines_figures():
    assert FirstOutput().figures(FIGURES, time.perf_counter()) == FIGURES


def test_the_first_output_sent_is_the_ttft_and_later_ones_change_nothing():
    accepted = time.perf_counter() - 0.5
    first = FirstOutput()
    first.sent()
    stamped = first.at
    first.sent()
    assert first.at == stamped
    figures = first.figures(FIGURES, accepted)
    assert figures["ttft"] == stamped - accepted >= 0.5
    assert {k: v for k, v in figures.items() if k != "ttft"} == {
        k: v for k, v in FIGURES.items() if k != "ttft"
    }
    assert FIGURES["ttft"] == 0.05  # the engine's dict is not changed


def test_an_answer_without_figures_gets_none():
    first = FirstOutput()
    first.sent()
    assert first.figures({}, time.perf_counter()) == {}
