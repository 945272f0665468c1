"""Small statistics helpers shared by request figures and telemetry."""

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (q in 0..100); None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99/max of a sample, the shape every latency figure is reported in."""
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else None,
    }
