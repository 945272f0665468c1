"""Admission policies compared on a virtual clock: the scheduler and the fake runner, no model.

    python bench/admission_sim.py [--horizon 130]

Another app keeps 12 streams of ~800-token documents going (their lengths and answers vary, so
the streams do not run in lockstep) on the product's 8 sequence slots; a person sends a short
chat every 15 s. Each step takes what the 2-core CPU's steps take (STEP_S: SmolLM2-135M, per
token cheaper the larger the step), on a virtual clock, so a run is exact and repeatable and
takes seconds. Printed per policy, with the flooding app's key interactive (the default) and
background: the person's TTFT p50 and max, its ITL p99, and the flood's output tok/s. With the
app's key interactive, "one anonymous share, no reserve" is admission as it was before fair
share (strict arrival order).

The choices it informed (scheduler.py): a slot in reserve for a person's first request, since
a paused request keeps its sequence (its KV stays in it) and cannot free one; background
prompts waiting while a person's prompt is read.
"""

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.engine.budget import TokenBudget  # noqa: E402
from inference.engine.params import SamplingParams  # noqa: E402
from inference.engine.request import Request, Status  # noqa: E402
from inference.engine.scheduler import Scheduler  # noqa: E402
from tests.inference.engine.fakes import FakeRunner  # noqa: E402 - checks the KV rules

# Seconds a step of n tokens takes, measured shapes on the 2-core CPU (see the issue): between
# the points, the line joining them.
STEP_S = {1: 0.022, 2: 0.023, 4: 0.025, 8: 0.030, 16: 0.036, 32: 0.048, 64: 0.085, 128: 0.140,
          256: 0.280, 512: 0.560}  # fmt: skip
SLOTS, CTX, BATCH = 8, 2048, 512


def step_seconds(n: int) -> float:
    sizes = sorted(STEP_S)
    for low, high in zip(sizes, sizes[1:], strict=False):
        if n <= high:
            return STEP_S[low] + (STEP_S[high] - STEP_S[low]) * (n - low) / (high - low)
    return STEP_S[sizes[-1]] * n / sizes[-1]


def simulate(*, fair: bool, reserve: int, app_priority: str, horizon: float, seed: int = 0):
    fake = FakeRunner(n_ctx=SLOTS * CTX, n_slots=SLOTS, ctx_per_seq=CTX, n_batch=BATCH)
    budget = TokenBudget(0.1, BATCH, background_itl_target=1.0)
    sched = Scheduler(n_ctx=fake.n_ctx, n_slots=SLOTS, ctx_per_seq=CTX, budget=budget,
                      reserve=reserve)  # fmt: skip
    rng = random.Random(seed)
    now, made, requests, persons = 0.0, 0, [], []
    times: dict[str, list[float]] = {}

    def submit(person: bool) -> Request:
        nonlocal made
        made += 1
        tokens, out = (60, 120) if person else (rng.randint(600, 1000), rng.randint(50, 250))
        request = Request(
            f"{'person' if person else 'app'}{made}", [made * 10_000 + i for i in range(tokens)],
            SamplingParams(max_tokens=out), now,
            priority="interactive" if person else app_priority,
            share=("user:5" if person else "apikey:3") if fair else None,
        )  # fmt: skip
        sched.add(request)
        requests.append(request)
        times[request.id] = []
        return request

    for _ in range(12):
        submit(person=False)
    arrivals = [20.0 + 15 * k for k in range(int((horizon - 20) // 15))]
    while now < horizon:
        if arrivals and now >= arrivals[0]:
            arrivals.pop(0)
            persons.append(submit(person=True))
        plan = sched.schedule(now)
        fake.trim(plan.kv_trims)
        if not plan.chunks:
            now += 0.01
            continue
        sampled = iter(tokens[0] for tokens in fake.execute(plan.chunks))
        seconds = step_seconds(plan.n_tokens)
        budget.observe(plan.n_tokens, seconds)
        now += seconds
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed += len(chunk.tokens)
            if chunk.sample:
                request.status = Status.DECODING
                request.output_ids.append(next(sampled))
                times[request.id].append(now)
                if len(request.output_ids) >= request.max_new_tokens:
                    sched.finish(request, keep_kv=True)
                    request.status = Status.FINISHED
                    if request not in persons:
                        submit(person=False)  # the app keeps its 12 streams going
    assert fake.violations == []
    ttft = [times[p.id][0] - p.accepted_at for p in persons if times[p.id]]
    itl = sorted(b - a for p in persons for a, b in zip(times[p.id], times[p.id][1:], strict=False))
    flood = sum(10 <= t for r in requests if r not in persons for t in times[r.id])
    return {"ttft_p50": statistics.median(ttft), "ttft_max": max(ttft),
            "itl_p99": itl[int(0.99 * (len(itl) - 1))], "flood_tps": flood / (horizon - 10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--horizon", type=float, default=130.0, help="virtual seconds")
    args = parser.parse_args()
    policies = [("one anonymous share, no reserve", dict(fair=False, reserve=0)),
                ("fair share, no slot in reserve", dict(fair=True, reserve=0)),
                ("fair share, one slot in reserve", dict(fair=True, reserve=1)),
                ("fair share, two slots in reserve", dict(fair=True, reserve=2))]  # fmt: skip
    for app_priority in ("interactive", "background"):
        print(f"the app's key {app_priority}:")
        base = None
        for name, policy in policies:
            r = simulate(app_priority=app_priority, horizon=args.horizon, **policy)
            base = base or r
            print(f"  {name:36s} person TTFT p50 {r['ttft_p50']:5.2f} s (max {r['ttft_max']:5.2f}),"
                  f" ITL p99 {r['itl_p99'] * 1000:3.0f} ms; flood {r['flood_tps']:5.1f} tok/s"
                  f" ({r['flood_tps'] / base['flood_tps']:.2f}x the first)")  # fmt: skip


if __name__ == "__main__":
    main()
