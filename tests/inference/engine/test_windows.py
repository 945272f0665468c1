"""The rolling 30 s / 5 min / 1 h windows behind the dashboard's window selector."""

import random

import pytest

from inference.engine.stats import percentile
from inference.engine.windows import LogHistogram, Window, Windows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_log_histogram_percentile_is_within_its_bin_of_the_exact_one(seed):
    rng = random.Random(seed)
    values = [rng.lognormvariate(-3, 1.2) for _ in range(5000)]
    hist = LogHistogram()
    for v in values:
        hist.add(v)
    ordered = sorted(values)
    for q in (50, 95, 99):
        exact = percentile(ordered, q)
        assert abs(hist.quantile(q) - exact) / exact < 0.05
    assert hist.distribution()["max"] == max(values)
    assert hist.distribution()["count"] == 5000


def test_an_empty_histogram_has_no_percentiles():
    assert LogHistogram().distribution() == {
        "p50": None, "p95": None, "p99": None, "max": None, "count": 0,
    }  # fmt: skip


def test_a_window_forgets_what_is_older_than_its_span():
    window = Window(30)
    window.record_step(100.2, prompt=500, output=1, seconds=0.1)
    window.record_itl(100.3, 2.0)  # a stall, long ago
    window.record_step(140.5, prompt=0, output=10, seconds=0.2)
    window.record_itl(140.6, 0.05)
    reading = window.reading(141.0)
    assert reading["prompt_tps"] == 0.0  # the prompt was read 40 s ago
    assert reading["output_tps"] == pytest.approx(10 / 30, rel=0.05)
    assert reading["itl"]["max"] == 0.05  # the old stall no longer counts
    assert reading["itl"]["count"] == 1


def test_a_windows_chart_has_thirty_points_the_last_one_filling():
    window = Window(30)
    window.record_step(200.1, prompt=0, output=5, seconds=0.1)
    window.record_itl(200.2, 0.04)
    window.record_step(229.5, prompt=100, output=1, seconds=0.1)
    series = window.reading(229.5)["series"]
    assert series["step_s"] == 1.0
    assert all(len(series[key]) == 30 for key in series if key != "step_s")
    assert series["output_tps"][0] == 5.0 and series["itl_p50"][0] == pytest.approx(0.04, 0.05)
    assert series["prompt_tps"][-1] == 200.0  # 100 tokens in the half second passed of it
    assert series["itl_p50"][1] is None  # nothing happened then: a gap, not a zero


def test_the_three_windows_read_the_same_events_over_their_own_spans():
    windows = Windows()
    windows.record_step(1000.0, prompt=0, output=300, seconds=1.0)
    windows.record_end(1000.0)
    reading = windows.reading(1200.0)  # 200 s later
    assert set(reading) == {"30", "300", "3600"}
    assert reading["30"]["output_tps"] == 0.0 and reading["30"]["ended"] == 0
    assert reading["300"]["output_tps"] > 0 and reading["300"]["ended"] == 1
    assert reading["3600"]["ended"] == 1
