"""What the live dashboard shows, cut from one inference worker's telemetry snapshot.

A snapshot (inference.serving.feed.worker_snapshot) carries every engine's full telemetry,
Prometheus histograms included, and every runner process's state; the browser needs a few numbers
per panel, a few times a second. Every number is checked here: what the socket sends is strict
JSON of known shapes, whatever a worker sent.

The "now" figures (inference.engine.telemetry): `now` is throughput over the last seconds;
`windows` has, per window the page can select (30 s, 5 min, 1 h), throughput, TTFT/ITL
percentiles and a 30-point chart; `steps` is what each recent engine step carried; `streams`
is each running request's live progress; `shares` is, per share (whose turn a request takes: an
app's key, an Open WebUI user behind a key, a person on the chat page) and priority, what it has
running, waiting and paused and the tokens it was served over the telemetry window. A share is an
id ("apikey:3"); the consumer adds the names (dashboard.web.share_names) as `apps`.

Engines from before fair share send no `shares`, no step columns `background`, `interactive` and
`paused`, no `share` or `paused` on a stream: those read as None (absent) or their neutral value,
and the page shows what it showed before. The same holds for warm memory and speculation: an
engine from before them sends no `prompt_cache`, no `speculation`, no step columns `verify` and
`output`, and their panels read None.

Warm memory (inference.engine.tiers; the engine's `prompt_cache`): each tier's size against its
bound, what admissions found where (a resident slot, the RAM tier, the disk tier, or nothing),
the tokens reused from each, the prompt time restoring saved. Speculation (`speculation`): the
tokens drafted and kept since load, and, from the step columns, how many tokens a decoding
stream wrote per step.
"""

import math
from typing import TypedDict

from inference.engine.tiers.entries import TIERS

WINDOWS = ("30", "300", "3600")
SERIES_COLUMNS = ("prompt_tps", "output_tps", "ttft_p50", "ttft_p95", "ttft_p99",
                  "itl_p50", "itl_p95", "itl_p99")  # fmt: skip
SERIES_POINTS = 30
STEP_COLUMNS = ("ago", "decode", "prompt", "ms", "seqs")
# Step columns of an engine with priorities; None in the panel when an engine sends none.
PRIORITY_STEP_COLUMNS = ("background", "interactive", "paused")
# Step columns of an engine with speculation: drafted tokens verified (a part of `decode`) and
# tokens sampled; None in the panel when an engine sends none.
SPECULATION_STEP_COLUMNS = ("verify", "output")
# Step columns of an engine that reads images: of the prompt tokens, image positions fed, and
# images the encoder was encoding when the step ended; None when an engine sends none.
VISION_STEP_COLUMNS = ("image", "encoding")
# Step columns in milliseconds of an engine that logs its budget: the target that bounded the
# step (0: none did) and the run its cost curve predicted; None when an engine sends none.
BUDGET_STEP_COLUMNS = ("target_ms", "predicted_ms")
OPTIONAL_STEP_COLUMNS = (*PRIORITY_STEP_COLUMNS, *SPECULATION_STEP_COLUMNS, *VISION_STEP_COLUMNS,
                         *BUDGET_STEP_COLUMNS)  # fmt: skip
MAX_STEPS = 300
MAX_STREAMS = 64
MAX_SHARES = 64  # an engine sends at most 32; a worker with two models may have twice that
MAX_SHARE_CHARS = 200  # a share id; an Open WebUI user id comes from a header
PRIORITIES = ("interactive", "background")

# RunnerState["state"] (inference.serving.supervisor); anything else from a snapshot is shown as
# "unknown" rather than trusted as text for the page.
RUNNER_STATES = frozenset({"starting", "running", "stopped", "crashed", "backing off", "failed"})
STORED_TIERS = ("ram", "disk")  # the tiers with a size and a bound (TIERS adds "resident")
ADMISSIONS = (*TIERS, "miss")  # where an admitted request's cached tokens came from, or none
# inference.engine.speculation.policy.MODES; anything else reads "unknown".
SPECULATION_MODES = frozenset({"off", "auto", "always"})


class Distribution(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class WindowDistribution(Distribution):
    count: int


class Series(TypedDict):
    step_s: float  # seconds between points; the last point is the slot now filling
    prompt_tps: list[float | None]
    output_tps: list[float | None]
    ttft_p50: list[float | None]
    ttft_p95: list[float | None]
    ttft_p99: list[float | None]
    itl_p50: list[float | None]
    itl_p95: list[float | None]
    itl_p99: list[float | None]


class WindowPanel(TypedDict):
    seconds: float
    prompt_tps: float
    output_tps: float
    busy_fraction: float
    ended: int
    ttft: WindowDistribution
    itl: WindowDistribution
    series: Series


class Steps(TypedDict):
    """The recent engine steps, oldest first, as columns."""

    ago: list[float]  # seconds before the snapshot that the step ended
    decode: list[int]  # decode tokens it carried (one per stream)
    prompt: list[int]  # prompt tokens it carried (chunks of prompts being read)
    ms: list[float]  # how long it ran
    seqs: list[int]  # sequences in its batch
    # None from an engine without priorities:
    background: list[int] | None  # of its decode tokens, those of background streams
    interactive: list[int] | None  # 1: an interactive stream was in it (the ITL target bound)
    paused: list[int] | None  # requests paused while it ran
    # None from an engine without speculation:
    verify: list[int] | None  # of its decode tokens, drafted ones being verified
    output: list[int] | None  # tokens it sampled (decodes, kept drafts, prompts that ended)
    # None from an engine from before images:
    image: list[int] | None  # of its prompt tokens, image positions fed from embeddings
    encoding: list[int] | None  # images the encoder was encoding beside it (0: encoder idle)
    # None from an engine from before the step log's budget:
    target_ms: list[float] | None  # the target that bounded it; 0: none did (a prompt read whole)
    predicted_ms: list[float] | None  # its run as the cost curve predicted it


class StreamPanel(TypedDict):
    id: str
    phase: str  # "prefilling" or "decoding"
    priority: str  # "interactive" or "background"
    share: str | None  # whose turn it takes ("apikey:3"); None: not said
    paused: bool
    prompt_tokens: int
    cached_tokens: int
    computed: int
    output_tokens: int
    max_tokens: int
    tps: float | None
    last_token_ago: float | None
    age: float


class SharePanel(TypedDict):
    """One share at one priority: what it has in the engine now, and what it was served."""

    share: str | None
    priority: str
    running: int
    waiting: int
    paused: int
    tokens_recent: int  # prompt + output tokens served to it over the telemetry window


class TierPanel(TypedDict):
    """A tier of kept prompts: what it holds against its bound."""

    bytes: int
    bound: int
    entries: int


class PromptCachePanel(TypedDict):
    """A model's warm memory since it loaded (inference.engine.tiers)."""

    enabled: bool  # False: no tiers; reuse is the resident slots' alone
    ram: TierPanel | None  # None: no tiers
    disk: TierPanel | None  # None: no disk tier (RAM only)
    disk_note: str  # what the disk tier dropped at load and why ("dropped 2 entries: ..."), or ""
    admitted: dict[str, int]  # requests by where their cached tokens came from: ADMISSIONS
    tokens: dict[str, int]  # cached tokens reused, by tier: TIERS
    saved_s: float  # prompt reading that restores saved (what reading would have cost, less them)
    restore_s: float  # what the restores took
    restore_bytes_per_s: float | None  # into the context from RAM (measured, else the prior)
    disk_bytes_per_s: float | None  # from the disk tier into RAM (measured, else the prior)
    saved: int  # sequences saved into the RAM tier
    spilled: int  # entries written from RAM to disk
    dropped: int  # entries let go to stay under the bounds
    spill_failed: int  # writes to disk that failed (a full disk): those entries went
    unreadable: int  # disk entries deleted unread (a mismatch, a bad checksum)


class SpeculationPanel(TypedDict):
    """A model's speculative decoding since it loaded (inference.engine.speculation)."""

    enabled: bool
    mode: str  # off, auto, always; "unknown" for anything else
    drafted: int  # draft tokens verified (llama-server's draft_n)
    accepted: int  # of those, kept (draft_n_accepted)
    drafts: int  # verifications that carried a draft
    acceptance: float | None  # accepted / drafted; None before any draft


class VisionPanel(TypedDict):
    """A model's image encoder since it loaded (inference.engine.vision)."""

    encoding: int  # images being encoded now (0: the encoder is idle)
    requests: int  # requests whose images are being read
    images_encoded: int  # images the projector encoded
    images_cached: int  # images found in the encoder's cache, not encoded again
    encode_s: float  # seconds spent reading images
    failed: int  # images that could not be read (their requests got an error)


class StepYield(TypedDict):
    """Over the recent steps that read no prompt (so every token they sampled is a decoding
    stream's): how many steps the decoding streams took part in, all together, and the tokens
    they wrote. tokens / stream_steps is tokens per step per stream: 1 without speculation."""

    stream_steps: int
    tokens: int


class StepBudget(TypedDict):
    """Over the recent steps a target bounded: how much of it they used (their time over their
    target, the median and the 90th percentile) and how far the scheduler's prediction was off
    (time over prediction, the 90th percentile: above 1, the steps ran longer than foreseen)."""

    steps: int
    used_p50: float
    used_p90: float
    error_p90: float | None  # None: no step with a prediction


class ModelPanel(TypedDict):
    prompt_tps: float
    output_tps: float
    ttft: Distribution
    itl: Distribution
    queue_depth: int
    active_sequences: int
    prefilling: int
    decoding: int
    slots: int
    kv_fill: float
    kv_used: int
    kv_size: int
    token_budget: int | None
    itl_target: float | None
    finished: int  # requests ended since the model loaded, any outcome: the table refreshes on it
    now: dict[str, float]  # prompt_tps, output_tps over the last seconds
    windows: dict[str, WindowPanel]
    steps: Steps
    streams: list[StreamPanel]
    shares: list[SharePanel] | None  # None: an engine that does not report shares
    window_s: float  # the telemetry window tokens_recent covers
    prompt_cache: PromptCachePanel | None  # None: an engine from before warm memory
    speculation: SpeculationPanel | None  # None: an engine from before speculation
    step_yield: StepYield | None  # None: an engine whose steps do not say what they sampled
    step_budget: StepBudget | None  # None: no step bounded by a target, or an engine from before
    vision: VisionPanel | None  # None: a model without a projector, or an engine from before


class GpuPanel(TypedDict):
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    process_bytes: int
    utilization: float | None


class MemoryPanel(TypedDict):
    kind: str  # "gpu": NVML per GPU; "ram": no GPU, the worker's RSS and the models' size
    gpus: list[GpuPanel]
    rss_bytes: int  # the worker's RSS with its runner processes'
    runners_rss_bytes: int  # the runner processes' share of it
    model_bytes: int
    ram_total_bytes: int | None
    ram_available_bytes: int | None


class RunnerPanel(TypedDict):
    """One model's runner process (inference.serving.supervisor.RunnerState), as the table
    shows it."""

    model: str
    state: str
    pid: int | None
    restarts: int
    crashes_in_a_row: int
    last_exit: str | None
    # Seconds from the last exit to the snapshot, both on the worker's clock: the browser's
    # clock may be off from the worker's, so it only adds the time since the snapshot arrived.
    last_exit_ago: float | None
    retry_in: float | None  # seconds until a restart is allowed, as of the snapshot
    extra_bufts: bool
    note: str


class Panels(TypedDict):
    worker: str
    mode: str
    time: float
    loading: str | None
    loaded: list[dict]
    prompt_tps: float
    output_tps: float
    ttft: Distribution
    itl: Distribution
    queue_depth: int
    active_sequences: int
    kv_fill: float
    finished: int
    now: dict[str, float]
    windows: dict[str, WindowPanel]  # summed over models: throughput added, latency worst
    streams: list[StreamPanel]
    shares: list[SharePanel] | None  # summed over models per share and priority
    apps: dict[str, str]  # share → the name shown, added by the consumer (empty here)
    cpu_percent: float | None
    cpu_count: int | None
    memory: MemoryPanel
    models: dict[str, ModelPanel]
    runners: list[RunnerPanel]
    box: dict | None  # dashboard.web.boxes.BoxPanel, added by the consumer (None here)
    machine: "MachinePanel"


def _number(value, default=0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _int(value) -> int:
    return int(_number(value, 0))


def _distribution(raw) -> Distribution:
    raw = raw if isinstance(raw, dict) else {}
    return {
        key: (_number(raw.get(key)) if raw.get(key) is not None else None)
        for key in ("p50", "p95", "p99", "max")
    }  # type: ignore[return-value]


def _worst(distributions: list[Distribution]) -> Distribution:
    """With several models loaded, each percentile's worst value: the one a user can feel."""
    worst: Distribution = {"p50": None, "p95": None, "p99": None, "max": None}
    for dist in distributions:
        for key, value in dist.items():
            if value is not None and (worst[key] is None or value > worst[key]):
                worst[key] = value
    return worst


def _number_list(raw, limit: int, *, optional: bool = False) -> list:
    if not isinstance(raw, list):
        return []
    return [(None if optional and value is None else _number(value)) for value in raw[-limit:]]


def _window_distribution(raw) -> WindowDistribution:
    raw = raw if isinstance(raw, dict) else {}
    return {**_distribution(raw), "count": _int(raw.get("count"))}  # type: ignore[typeddict-item]


def series_panel(raw) -> Series:
    raw = raw if isinstance(raw, dict) else {}
    columns = {}
    for key in SERIES_COLUMNS:
        values = _number_list(raw.get(key), SERIES_POINTS, optional=True)
        columns[key] = values + [None] * (SERIES_POINTS - len(values))  # every column 30 long
    return {"step_s": _number(raw.get("step_s")), **columns}  # type: ignore[typeddict-item]


def window_panel(raw) -> WindowPanel:
    raw = raw if isinstance(raw, dict) else {}
    return {
        "seconds": _number(raw.get("seconds")),
        "prompt_tps": _number(raw.get("prompt_tps")),
        "output_tps": _number(raw.get("output_tps")),
        "busy_fraction": _number(raw.get("busy_fraction")),
        "ended": _int(raw.get("ended")),
        "ttft": _window_distribution(raw.get("ttft")),
        "itl": _window_distribution(raw.get("itl")),
        "series": series_panel(raw.get("series")),
    }


def steps_panel(raw) -> Steps:
    raw = raw if isinstance(raw, dict) else {}
    columns = {key: _number_list(raw.get(key), MAX_STEPS) for key in STEP_COLUMNS}
    optional = [key for key in OPTIONAL_STEP_COLUMNS if isinstance(raw.get(key), list)]
    columns.update({key: _number_list(raw.get(key), MAX_STEPS) for key in optional})
    n = min(len(column) for column in columns.values())  # ragged columns: the common tail
    steps: dict = {key: None for key in OPTIONAL_STEP_COLUMNS}
    steps.update({key: column[len(column) - n :] for key, column in columns.items()})
    for key in ("decode", "prompt", "seqs"):
        steps[key] = [int(v) for v in steps[key]]
    for key in optional:
        cast = float if key in BUDGET_STEP_COLUMNS else int
        steps[key] = [max(0, cast(v)) for v in steps[key]]
    if steps["background"] is not None:  # a part of the step's decode tokens
        pairs = zip(steps["background"], steps["decode"], strict=True)
        steps["background"] = [min(b, d) for b, d in pairs]
    if steps["interactive"] is not None:
        steps["interactive"] = [min(1, v) for v in steps["interactive"]]
    if steps["verify"] is not None:  # also a part of the decode tokens
        pairs = zip(steps["verify"], steps["decode"], strict=True)
        steps["verify"] = [min(v, d) for v, d in pairs]
    if steps["image"] is not None:  # a part of the step's prompt tokens
        pairs = zip(steps["image"], steps["prompt"], strict=True)
        steps["image"] = [min(i, p) for i, p in pairs]
    return steps  # type: ignore[return-value]


def step_budget(steps: Steps) -> StepBudget | None:
    """How much of their target the recent bounded steps used, and how far off their
    predictions were (StepBudget); None when no step says it was bounded."""
    if steps["target_ms"] is None or steps["predicted_ms"] is None:
        return None
    rows = [(ms, target, predicted) for ms, target, predicted
            in zip(steps["ms"], steps["target_ms"], steps["predicted_ms"], strict=True)
            if target > 0]  # fmt: skip
    if not rows:
        return None
    used = sorted(ms / target for ms, target, _ in rows)
    errors = sorted(ms / predicted for ms, _, predicted in rows if predicted > 0)
    return {"steps": len(rows), "used_p50": _quantile(used, 0.5), "used_p90": _quantile(used, 0.9),
            "error_p90": _quantile(errors, 0.9) if errors else None}  # fmt: skip


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def step_yield(steps: Steps) -> StepYield | None:
    """Tokens per step per decoding stream, as two sums (StepYield). A step that read a prompt
    is left out: the first token of a prompt that ended in it is sampled too, and would read
    as a stream writing more than one token."""
    if steps["output"] is None:
        return None
    verify = steps["verify"] or [0] * len(steps["decode"])
    rows = zip(steps["decode"], verify, steps["prompt"], steps["output"], strict=True)
    stream_steps = tokens = 0
    for decode, drafted, prompt, output in rows:
        if prompt == 0 and decode > drafted:
            stream_steps += decode - drafted  # one decode token per stream, besides its draft
            tokens += output
    return {"stream_steps": stream_steps, "tokens": tokens}


def _count(value) -> int:
    return max(0, _int(value))


def _rate(value) -> float | None:
    rate = _number(value, None)
    return rate if rate is not None and rate > 0 else None


def _tier(raw) -> TierPanel:
    raw = raw if isinstance(raw, dict) else {}
    return {"bytes": _count(raw.get("bytes")), "bound": _count(raw.get("bound")),
            "entries": _count(raw.get("entries"))}  # fmt: skip


def _note(raw) -> str:
    """A short sentence an engine sent, as text (an engine from before it sends none)."""
    return " ".join(raw.split())[:200] if isinstance(raw, str) else ""


def prompt_cache_panel(raw) -> PromptCachePanel | None:
    """A model's warm memory (PromptCachePanel), or None from an engine without it. Sizes are
    shown as sent, above the bound too: the bound holding is what the panel is there to show."""
    if not isinstance(raw, dict):
        return None
    enabled = raw.get("enabled") is True
    use = raw.get("use") if isinstance(raw.get("use"), dict) else {}
    admitted = use.get("admitted") if isinstance(use.get("admitted"), dict) else {}
    tokens = use.get("tokens") if isinstance(use.get("tokens"), dict) else {}
    disk = raw.get("disk") if isinstance(raw.get("disk"), dict) else {}
    on_disk = enabled and disk.get("enabled") is True
    return {
        "enabled": enabled,
        "ram": _tier(raw.get("ram")) if enabled else None,
        "disk": _tier(disk) if on_disk else None,
        "disk_note": _note(disk.get("note")) if on_disk else "",
        "admitted": {key: _count(admitted.get(key)) for key in ADMISSIONS},
        "tokens": {key: _count(tokens.get(key)) for key in TIERS},
        "saved_s": max(0.0, _number(use.get("saved_seconds"))),
        "restore_s": max(0.0, _number(use.get("restore_seconds"))),
        "restore_bytes_per_s": _rate(raw.get("restore_bytes_per_s")) if enabled else None,
        "disk_bytes_per_s": _rate(raw.get("disk_bytes_per_s")) if on_disk else None,
        "saved": _count(raw.get("saved")),
        "spilled": _count(raw.get("spilled")),
        "dropped": _count(raw.get("dropped")),
        "spill_failed": _count(raw.get("spill_failed")),
        "unreadable": _count(raw.get("unreadable")),
    }  # fmt: skip


def speculation_panel(raw) -> SpeculationPanel | None:
    """A model's speculation (SpeculationPanel), or None from an engine without it. The
    acceptance is worked out here from the two counts, never taken as sent."""
    if not isinstance(raw, dict):
        return None
    mode = raw.get("mode")
    if not (isinstance(mode, str) and mode in SPECULATION_MODES):
        # An engine built without speculation says only {"enabled": false}.
        mode = "off" if mode is None and raw.get("enabled") is False else "unknown"
    drafted = _count(raw.get("drafted"))
    accepted = min(_count(raw.get("accepted")), drafted)  # kept tokens are drafted ones
    return {
        "enabled": raw.get("enabled") is True,
        "mode": mode,
        "drafted": drafted,
        "accepted": accepted,
        "drafts": _count(raw.get("drafts")),
        "acceptance": accepted / drafted if drafted else None,
    }  # fmt: skip


def vision_panel(raw) -> VisionPanel | None:
    """A model's image encoder (VisionPanel), or None from a model that reads no images."""
    if not isinstance(raw, dict):
        return None
    return {"encoding": _count(raw.get("encoding")), "requests": _count(raw.get("requests")),
            "images_encoded": _count(raw.get("images_encoded")),
            "images_cached": _count(raw.get("images_cached")),
            "encode_s": max(0.0, _number(raw.get("encode_seconds"))),
            "failed": _count(raw.get("failed"))}  # fmt: skip


def _share(value) -> str | None:
    return value[:MAX_SHARE_CHARS] if isinstance(value, str) and value else None


def _priority(value) -> str:
    return value if value in PRIORITIES else "interactive"


def stream_panel(raw: dict) -> StreamPanel:
    phase = raw.get("phase")
    return {
        "id": (_text(raw.get("id")) or "")[:8],
        "phase": phase if phase in ("prefilling", "decoding") else "prefilling",
        "priority": _priority(raw.get("priority")),
        "share": _share(raw.get("share")),
        "paused": raw.get("paused") is True,
        "prompt_tokens": _int(raw.get("prompt_tokens")),
        "cached_tokens": _int(raw.get("cached_tokens")),
        "computed": _int(raw.get("computed")),
        "output_tokens": _int(raw.get("output_tokens")),
        "max_tokens": _int(raw.get("max_tokens")),
        "tps": _number(raw.get("tps"), None),
        "last_token_ago": _number(raw.get("last_token_ago"), None),
        "age": _number(raw.get("age")),
    }


def share_panel(raw: dict) -> SharePanel:
    return {
        "share": _share(raw.get("share")),
        "priority": _priority(raw.get("priority")),
        "running": _int(raw.get("running")),
        "waiting": _int(raw.get("waiting")),
        "paused": _int(raw.get("paused")),
        "tokens_recent": _int(raw.get("tokens_recent")),
    }


def merged_shares(rows: list[SharePanel]) -> list[SharePanel]:
    """Rows of several models added up per share and priority, in a stable order (by share,
    interactive first) so that the table does not reshuffle a few times a second."""
    merged: dict[tuple, SharePanel] = {}
    for row in rows:
        key = (row["share"], row["priority"])
        if key not in merged:
            merged[key] = {**row}
            continue
        for field in ("running", "waiting", "paused", "tokens_recent"):
            merged[key][field] += row[field]  # type: ignore[literal-required]
    order = sorted(merged, key=lambda k: (k[0] is None, k[0] or "", PRIORITIES.index(k[1])))
    return [merged[key] for key in order][:MAX_SHARES]


def model_panel(snapshot: dict) -> ModelPanel:
    now = snapshot.get("now") if isinstance(snapshot.get("now"), dict) else {}
    windows = snapshot.get("windows") if isinstance(snapshot.get("windows"), dict) else {}
    streams = snapshot.get("streams") if isinstance(snapshot.get("streams"), list) else []
    shares = snapshot.get("shares") if isinstance(snapshot.get("shares"), list) else None
    steps = steps_panel(snapshot.get("steps"))
    return {
        "prompt_tps": _number(snapshot.get("prompt_tps")),
        "output_tps": _number(snapshot.get("output_tps")),
        "ttft": _distribution(snapshot.get("ttft")),
        "itl": _distribution(snapshot.get("itl")),
        "queue_depth": _int(snapshot.get("queue_depth")),
        "active_sequences": _int(snapshot.get("active_sequences")),
        "prefilling": _int(snapshot.get("prefilling")),
        "decoding": _int(snapshot.get("decoding")),
        "slots": _int(snapshot.get("slots")),
        "kv_fill": _number(snapshot.get("kv_fill")),
        "kv_used": _int(snapshot.get("kv_used")),
        "kv_size": _int(snapshot.get("kv_size")),
        "token_budget": _int(snapshot["token_budget"]) if "token_budget" in snapshot else None,
        "itl_target": _number(snapshot.get("itl_target"), None),
        "finished": sum(_int(v) for v in (snapshot.get("outcomes") or {}).values()),
        "now": {
            "prompt_tps": _number(now.get("prompt_tps")),
            "output_tps": _number(now.get("output_tps")),
        },  # fmt: skip
        "windows": {key: window_panel(windows.get(key)) for key in WINDOWS},
        "steps": steps,
        "streams": [stream_panel(row) for row in streams[:MAX_STREAMS] if isinstance(row, dict)],
        "shares": (
            None
            if shares is None
            else merged_shares([share_panel(row) for row in shares if isinstance(row, dict)])
        ),
        "window_s": _number(snapshot.get("window_s"), 10.0),
        "prompt_cache": prompt_cache_panel(snapshot.get("prompt_cache")),
        "speculation": speculation_panel(snapshot.get("speculation")),
        "step_yield": step_yield(steps),
        "step_budget": step_budget(steps),
        "vision": vision_panel(snapshot.get("vision")),
    }


def _add(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _highest(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def combined_window(windows: list[WindowPanel], seconds: float) -> WindowPanel:
    """Several models' readings of one window: throughput added, each percentile its worst
    (as the tiles do), point by point for the charts."""
    series: dict = {"step_s": max((w["series"]["step_s"] for w in windows), default=0.0)}
    for key in SERIES_COLUMNS:
        merge = _add if key.endswith("_tps") else _highest
        columns = [w["series"][key] for w in windows]
        series[key] = [merge([c[i] for c in columns]) for i in range(SERIES_POINTS)]
        if key.endswith("_tps"):
            series[key] = [v or 0.0 for v in series[key]]

    def dist(key: str) -> WindowDistribution:
        worst = _worst([_distribution(w[key]) for w in windows])  # type: ignore[misc]
        return {**worst, "count": sum(w[key]["count"] for w in windows)}  # type: ignore[typeddict-item]

    return {
        "seconds": seconds,
        "prompt_tps": sum(w["prompt_tps"] for w in windows),
        "output_tps": sum(w["output_tps"] for w in windows),
        "busy_fraction": max((w["busy_fraction"] for w in windows), default=0.0),
        "ended": sum(w["ended"] for w in windows),
        "ttft": dist("ttft"),
        "itl": dist("itl"),
        "series": series,  # type: ignore[typeddict-item]
    }


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def runner_panel(raw: dict, snapshot_time: float) -> RunnerPanel:
    state = raw.get("state")
    pid = raw.get("pid")
    exit_at = _number(raw.get("last_exit_at"), None)
    retry_in = _number(raw.get("retry_in"), None)
    return {
        "model": _text(raw.get("model")) or "",
        "state": state if isinstance(state, str) and state in RUNNER_STATES else "unknown",
        "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        "restarts": _int(raw.get("restarts")),
        "crashes_in_a_row": _int(raw.get("crashes_in_a_row")),
        "last_exit": _text(raw.get("last_exit")),
        "last_exit_ago": (
            max(0.0, snapshot_time - exit_at) if exit_at is not None and snapshot_time else None
        ),
        "retry_in": retry_in if retry_in is not None and retry_in > 0 else None,
        "extra_bufts": raw.get("extra_bufts") is not False,
        "note": _text(raw.get("note")) or "",
    }


def memory_panel(system: dict) -> MemoryPanel:
    gpus: list[GpuPanel] = [
        {
            "index": _int(gpu.get("index")),
            "name": str(gpu.get("name") or f"GPU {gpu.get('index', '?')}"),
            "used_bytes": _int(gpu.get("used_bytes")),
            "total_bytes": _int(gpu.get("total_bytes")),
            "process_bytes": _int(gpu.get("process_bytes")),
            "utilization": _number(gpu.get("utilization"), None),
        }
        for gpu in system.get("gpus") or []
        if isinstance(gpu, dict)
    ]
    return {
        "kind": "gpu" if gpus else "ram",
        "gpus": gpus,
        "rss_bytes": _int(system.get("rss_bytes")),
        "runners_rss_bytes": _int(system.get("runners_rss_bytes")),
        "model_bytes": _int(system.get("model_bytes")),
        "ram_total_bytes": _int(system["ram_total_bytes"]) if "ram_total_bytes" in system else None,
        "ram_available_bytes": (
            _int(system["ram_available_bytes"]) if "ram_available_bytes" in system else None
        ),
    }


def panels(snapshot: dict) -> Panels:
    """The dashboard's panels for one worker: engine figures summed over its loaded models
    (throughput, queue, sequences), latencies at their worst, the box's memory and CPU, and
    its runner processes."""
    models = {
        str(name): model_panel(snap)
        for name, snap in (snapshot.get("models") or {}).items()
        if isinstance(snap, dict)
    }
    system = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    loaded = [
        {"name": str(row.get("name")), "size_bytes": _int(row.get("size_bytes")),
         "busy": bool(row.get("busy")), "expires_in": _number(row.get("expires_in"), None)}
        for row in snapshot.get("loaded") or []
        if isinstance(row, dict)
    ]  # fmt: skip
    time = _number(snapshot.get("time"))
    raw_runners = snapshot.get("runners")
    runners = [
        runner_panel(row, time)
        for row in (raw_runners if isinstance(raw_runners, list) else [])
        if isinstance(row, dict) and _text(row.get("model"))
    ]
    return {
        "worker": str(snapshot.get("worker") or ""),
        "mode": str(snapshot.get("mode") or ""),
        "time": time,
        "loading": snapshot.get("loading") if isinstance(snapshot.get("loading"), str) else None,
        "loaded": loaded,
        "prompt_tps": sum(m["prompt_tps"] for m in models.values()),
        "output_tps": sum(m["output_tps"] for m in models.values()),
        "ttft": _worst([m["ttft"] for m in models.values()]),
        "itl": _worst([m["itl"] for m in models.values()]),
        "queue_depth": sum(m["queue_depth"] for m in models.values()),
        "active_sequences": sum(m["active_sequences"] for m in models.values()),
        "kv_fill": max((m["kv_fill"] for m in models.values()), default=0.0),
        "finished": sum(m["finished"] for m in models.values()),
        "now": {
            key: sum(m["now"][key] for m in models.values()) for key in ("prompt_tps", "output_tps")
        },  # fmt: skip
        "windows": {
            key: combined_window([m["windows"][key] for m in models.values()], float(key))
            for key in WINDOWS
        },
        "streams": [{**row, "model": name} for name, m in models.items() for row in m["streams"]],  # type: ignore[misc]
        "shares": (
            merged_shares([row for m in models.values() for row in m["shares"] or []])
            if any(m["shares"] is not None for m in models.values())
            else None
        ),
        "apps": {},
        "cpu_percent": _number(system.get("cpu_percent"), None),
        "cpu_count": _int(system["cpu_count"]) if system.get("cpu_count") else None,
        "memory": memory_panel(system),
        "models": models,
        "runners": sorted(runners, key=lambda r: r["model"]),
        "box": None,
        "machine": machine_panel(snapshot),
    }


def shares_in(result: Panels) -> set[str]:
    """The share ids the panels mention: the ones the page needs names for."""
    rows = [*(result["shares"] or []), *result["streams"]]
    return {row["share"] for row in rows if row["share"] is not None}


# --- the machine: which llama.cpp, each card's load, each runner's GPU memory ---------------------

GPU_PARTS = ("weights", "kv", "compute")


class CardPanel(TypedDict):
    """One GPU's load (NVML); None where the card does not report it."""

    index: int
    name: str
    utilization: float | None  # percent
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None


class RunnerGpuPanel(TypedDict):
    """One runner process's GPU memory: NVML's count for the process, beside what llama.cpp
    says it allocated there (inference.engine.buffers); None where either does not say."""

    model: str
    pid: int | None
    nvml_bytes: int | None  # all GPUs together
    weights_bytes: int | None
    kv_bytes: int | None
    compute_bytes: int | None
    gpu_layers: int | None  # layers llama.cpp put on GPUs (its count: blocks and output)
    layers: int | None


class MachinePanel(TypedDict):
    gpu: bool  # NVML sees a GPU; False: the page says "no GPU", never zeros
    build: str | None  # "gpu": this llama.cpp offloads to a GPU; "cpu": CPU only; None: unknown
    cards: list[CardPanel]
    runners: list[RunnerGpuPanel]


def _optional_number(value) -> float | None:
    return None if value is None else _number(value, None)


def _optional_int(value) -> int | None:
    number = _optional_number(value)
    return None if number is None else int(number)


def card_panel(raw: dict) -> CardPanel:
    return {
        "index": _int(raw.get("index")),
        "name": str(raw.get("name") or f"GPU {raw.get('index', '?')}")[:100],
        "utilization": _optional_number(raw.get("utilization")),
        "temperature_c": _optional_number(raw.get("temperature_c")),
        "power_w": _optional_number(raw.get("power_w")),
        "power_limit_w": _optional_number(raw.get("power_limit_w")),
    }


def _nvml_bytes_by_pid(gpus: list) -> dict[int, int | None]:
    """Each process's GPU memory on all cards (NVML); None for a process NVML cannot count."""
    found: dict[int, int | None] = {}
    for gpu in gpus:
        rows = gpu.get("processes") if isinstance(gpu, dict) else None
        for row in rows if isinstance(rows, list) else []:
            pid = row.get("pid") if isinstance(row, dict) else None
            if not isinstance(pid, int) or isinstance(pid, bool):
                continue
            used = _optional_int(row.get("bytes"))
            if used is None:
                found.setdefault(pid, None)
            else:
                found[pid] = (found.get(pid) or 0) + used
    return found


def runner_gpu_panel(model: str, info: dict, pid: int | None,
                     nvml: dict[int, int | None]) -> RunnerGpuPanel:  # fmt: skip
    split = info.get("gpu_buffers") if isinstance(info.get("gpu_buffers"), dict) else None
    reported = split is not None and bool(info.get("gpu_offload"))

    def part(name: str) -> int | None:
        return _int(split.get(name)) if reported else None

    return {
        "model": model[:200],
        "pid": pid,
        "nvml_bytes": nvml.get(pid) if pid is not None else None,
        "weights_bytes": part("weights"),
        "kv_bytes": part("kv"),
        "compute_bytes": part("compute"),
        "gpu_layers": _optional_int(info.get("gpu_layers")),
        "layers": _optional_int(info.get("layers")),
    }


def machine_panel(snapshot: dict) -> MachinePanel:
    """The machine panel of one worker: the llama.cpp build its runners use (their info says
    whether it offloads to a GPU), each card's load, and per runner its GPU memory as NVML
    counts it beside llama.cpp's own split."""
    system = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    gpus = [g for g in system.get("gpus") or [] if isinstance(g, dict)]
    models = snapshot.get("models") if isinstance(snapshot.get("models"), dict) else {}
    infos = {str(name): m.get("model") for name, m in models.items()
             if isinstance(m, dict) and isinstance(m.get("model"), dict)}  # fmt: skip
    pids = {}
    for row in snapshot.get("runners") or []:
        if isinstance(row, dict) and isinstance(row.get("pid"), int):
            pids[str(row.get("model"))] = row["pid"]
    offloads = [bool(info.get("gpu_offload")) for info in infos.values()]
    nvml = _nvml_bytes_by_pid(gpus)
    runners = [runner_gpu_panel(name, info, pids.get(name), nvml)
               for name, info in sorted(infos.items())] if gpus else []  # fmt: skip
    return {
        "gpu": bool(gpus),
        "build": ("gpu" if any(offloads) else "cpu") if offloads else None,
        "cards": [card_panel(g) for g in gpus],
        "runners": runners,
    }
