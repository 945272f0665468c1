"""Prometheus /metrics, built from the inference workers' telemetry snapshots.

The engines keep cumulative histograms and counters themselves (inference.engine.telemetry), so
this process only translates the latest snapshot of each worker into metric families: it works
the same whether the engine runs in this process or on another box. Names follow vLLM's, under
an `appliance_` prefix; docs/metrics.md lists them. Counters restart from zero when a model is
reloaded, which Prometheus' rate() treats as a counter reset.

TTFT and ITL carry a `priority` label (interactive or background, never more values: no label
per key or user). An engine that reports them by priority (snapshot["by_priority"]) exports one
series per priority, which add up to all its requests, and no unlabelled total beside them (a
sum over the family would count every request twice); an engine from before priorities exports
its one histogram with `priority` empty, which Prometheus stores as no label at all.

Warm memory (snapshot["prompt_cache"], inference.engine.tiers) and speculation
(snapshot["speculation"]) add a `tier` label of a few fixed values, never a key, a person or a
conversation: bytes, bound and entries per stored tier (ram, disk), admissions per tier where
the cached tokens were found (resident, ram, disk, or miss), reused tokens per tier. An engine
from before them, or a value that is not a number, exports no series for it.
"""

import asyncio
import math
from collections.abc import Callable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from dashboard.api.auth import api_endpoint
from inference.engine.tiers.entries import TIERS
from inference.serving.client import get_client

MODEL = ["worker", "model"]
PRIORITIES = ("interactive", "background")
BY_PRIORITY = ("ttft", "itl")  # the histograms with a `priority` label

# engine snapshot histogram → (metric name, help)
HISTOGRAMS = {
    "ttft": ("appliance_time_to_first_token_seconds",
             "Request accepted to first output token sent (queue + load + prefill)."),
    "itl": ("appliance_inter_token_latency_seconds",
            "Gap between two consecutive output tokens sent."),
    "queue_time": ("appliance_request_queue_time_seconds",
                   "Request accepted to admitted to the engine."),
    "prefill_time": ("appliance_request_prefill_time_seconds",
                     "First prefill chunk started to first output token sampled."),
    "e2e": ("appliance_e2e_request_latency_seconds", "Request accepted to answer finished."),
}  # fmt: skip

# engine snapshot totals → (counter name without _total, help)
TOTALS = {
    "prompt_tokens": ("appliance_prompt_tokens",
                      "Prompt tokens prefilled (tokens reused from the prefix cache excluded)."),
    "cached_tokens": ("appliance_cached_prompt_tokens",
                      "Prompt tokens reused from the KV prefix cache."),
    "output_tokens": ("appliance_generation_tokens", "Output tokens generated."),
    "images_encoded": ("appliance_images_encoded", "Images run through the vision projector."),
    "images_cached": ("appliance_images_cached",
                      "Images whose embeddings came from the encoder cache."),
    "encode_seconds": ("appliance_image_encode_seconds",
                       "Seconds spent reading requests' images (decoding and encoding)."),
    "image_tokens": ("appliance_image_tokens", "Image positions in prompts read."),
    "embedded_inputs": ("appliance_embedded_inputs", "Inputs embedded (each one pooled vector)."),
    "embedded_tokens": ("appliance_embedded_tokens", "Tokens of the inputs embedded."),
    "reranked_documents": ("appliance_reranked_documents",
                           "Documents a reranker scored against a query."),
    "reranked_tokens": ("appliance_reranked_tokens",
                        "Tokens of the (query, document) pairs a reranker scored."),
}  # fmt: skip

# engine snapshot field → (gauge name, help)
MODEL_GAUGES = {
    "active_sequences": ("appliance_requests_running", "Requests prefilling or decoding."),
    "queue_depth": ("appliance_requests_waiting", "Requests waiting for admission."),
    "kv_fill": ("appliance_kv_cache_usage_ratio", "Fraction of the KV cache cells in use."),
    "prompt_tps": ("appliance_prompt_throughput_tokens_per_second",
                   "Prompt tokens processed per second over the telemetry window."),
    "output_tps": ("appliance_generation_throughput_tokens_per_second",
                   "Output tokens generated per second over the telemetry window."),
}  # fmt: skip


# Warm memory: the tiers with a size and a bound, and where an admission found its tokens.
STORED_TIERS = ("ram", "disk")
ADMISSIONS = (*TIERS, "miss")
# snapshot["prompt_cache"]["ram" | "disk"] field → (gauge name, help), labelled by tier
TIER_GAUGES = {
    "bytes": ("appliance_prompt_cache_bytes", "Bytes of kept prompts held in the tier."),
    "bound": ("appliance_prompt_cache_bound_bytes",
              "The tier's bound in bytes: what it holds is kept under it."),
    "entries": ("appliance_prompt_cache_entries", "Kept prompts held in the tier."),
}  # fmt: skip
# snapshot["prompt_cache"]["use"] seconds → (counter name without _total, help)
CACHE_SECONDS = {
    "saved_seconds": ("appliance_prompt_cache_saved_seconds",
                      "Prompt reading that restoring kept prompts saved (what reading their "
                      "tokens again would have taken, less the restores)."),
    "restore_seconds": ("appliance_prompt_cache_restore_seconds",
                        "Time spent restoring kept prompts from RAM and disk."),
}  # fmt: skip
# snapshot["speculation"] field → (counter name without _total, help): vLLM's names
SPECULATION = {
    "drafted": ("appliance_spec_decode_num_draft_tokens",
                "Draft tokens verified (llama-server's draft_n)."),
    "accepted": ("appliance_spec_decode_num_accepted_tokens",
                 "Draft tokens kept: the model's own tokens (draft_n_accepted)."),
    "drafts": ("appliance_spec_decode_num_drafts", "Verifications that carried a draft."),
}  # fmt: skip


def _buckets(histogram: dict) -> list[tuple[str, float]]:
    pairs = zip(histogram["buckets"], histogram["cumulative"], strict=True)
    return [(floatToGoString(le), float(count)) for le, count in pairs]


def _histogram(raw) -> dict | None:
    """An engine histogram (inference.engine.telemetry._Histogram.export) fit to export, or
    None: a malformed one is left out rather than failing the whole scrape."""
    if not isinstance(raw, dict) or not isinstance(raw.get("sum"), int | float):
        return None
    buckets, cumulative = raw.get("buckets"), raw.get("cumulative")
    if not isinstance(buckets, list) or not isinstance(cumulative, list):
        return None
    return raw if buckets and len(buckets) == len(cumulative) else None


def _series(engine: dict, key: str) -> list[tuple[list[str], dict]]:
    """(extra label values, histogram) for each series of the engine's `key` histogram. TTFT
    and ITL: one per priority when the engine reports each of them, else its one histogram with
    the priority empty."""
    whole = _histogram(_field(engine, "histograms", key))
    if key not in BY_PRIORITY:
        return [([], whole)] if whole else []
    split = [
        (p, _histogram(_field(engine, "by_priority", p, "histograms", key))) for p in PRIORITIES
    ]
    if all(histogram is not None for _, histogram in split):
        return [([priority], histogram) for priority, histogram in split]  # type: ignore[misc]
    return [([""], whole)] if whole else []


def _field(raw, *path):
    for key in path:
        raw = raw.get(key) if isinstance(raw, dict) else None
    return raw


def _count(raw) -> float | None:
    """A count or an amount from a snapshot, or None: a series is left out rather than
    exported with a value a worker did not mean (junk, negative, not finite)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return float(raw) if math.isfinite(raw) and raw >= 0 else None


class WarmMemoryFamilies:
    """The warm memory and speculation families, filled from one engine at a time."""

    def __init__(self):
        tier = [*MODEL, "tier"]
        self.tiers = {key: GaugeMetricFamily(name, doc, labels=tier)
                      for key, (name, doc) in TIER_GAUGES.items()}  # fmt: skip
        self.admissions = CounterMetricFamily(
            "appliance_prompt_cache_admissions",
            "Requests admitted, by the tier their cached prompt tokens came from (resident: a "
            "sequence slot; ram, disk: kept prompts restored), or miss: none.", labels=tier,
        )  # fmt: skip
        self.reused = CounterMetricFamily(
            "appliance_prompt_cache_reused_tokens",
            "Prompt tokens reused instead of read again, by the tier they came from.",
            labels=tier,
        )  # fmt: skip
        self.seconds = {key: CounterMetricFamily(name, doc, labels=MODEL)
                        for key, (name, doc) in CACHE_SECONDS.items()}  # fmt: skip
        self.speculation = {key: CounterMetricFamily(name, doc, labels=MODEL)
                            for key, (name, doc) in SPECULATION.items()}  # fmt: skip

    def add(self, labels: list[str], engine: dict) -> None:
        cache = engine.get("prompt_cache")
        enabled = _field(cache, "enabled") is True  # off: no tiers, the slots' reuse only
        held = {"ram": enabled, "disk": enabled and _field(cache, "disk", "enabled") is True}
        for tier in STORED_TIERS:
            for key, family in self.tiers.items():
                value = _count(_field(cache, tier, key))
                if held[tier] and value is not None:
                    family.add_metric([*labels, tier], value)
        for family, field, tiers in ((self.admissions, "admitted", ADMISSIONS),
                                     (self.reused, "tokens", TIERS)):  # fmt: skip
            for tier in tiers:
                value = _count(_field(cache, "use", field, tier))
                if value is not None:
                    family.add_metric([*labels, tier], value)
        for key, family in self.seconds.items():
            value = _count(_field(cache, "use", key))
            if value is not None:
                family.add_metric(labels, value)
        for key, family in self.speculation.items():
            value = _count(_field(engine, "speculation", key))
            if value is not None:
                family.add_metric(labels, value)

    def families(self) -> list:
        return [*self.tiers.values(), self.admissions, self.reused, *self.seconds.values(),
                *self.speculation.values()]  # fmt: skip


class SnapshotCollector:
    """Metric families from `source()`: one telemetry snapshot per inference worker."""

    def __init__(self, source: Callable[[], list[dict]]):
        self.source = source

    def collect(self) -> Iterator:
        snapshots = self.source()
        histograms = {
            key: HistogramMetricFamily(
                name, doc, labels=[*MODEL, "priority"] if key in BY_PRIORITY else MODEL
            )
            for key, (name, doc) in HISTOGRAMS.items()
        }
        totals = {key: CounterMetricFamily(name, doc, labels=MODEL)
                  for key, (name, doc) in TOTALS.items()}  # fmt: skip
        gauges = {key: GaugeMetricFamily(name, doc, labels=MODEL)
                  for key, (name, doc) in MODEL_GAUGES.items()}  # fmt: skip
        outcomes = CounterMetricFamily("appliance_requests", "Requests ended, by outcome.",
                                       labels=[*MODEL, "outcome"])  # fmt: skip
        loaded = GaugeMetricFamily("appliance_models_loaded", "Models loaded.", labels=["worker"])
        loading = GaugeMetricFamily("appliance_model_loading", "1 while a model is loading.",
                                    labels=["worker"])  # fmt: skip
        rss = GaugeMetricFamily("appliance_process_resident_memory_bytes",
                                "Resident memory of the inference worker and its runners.",
                                labels=["worker"])  # fmt: skip
        runner_up = GaugeMetricFamily("appliance_runner_up",
                                      "1 while the model's runner process is running.",
                                      labels=MODEL)  # fmt: skip
        restarts = CounterMetricFamily("appliance_runner_restarts",
                                       "Times the model's runner process was started again "
                                       "after it ended by itself.", labels=MODEL)  # fmt: skip
        mapped = GaugeMetricFamily("appliance_model_mapped_bytes",
                                   "Size of the loaded model files (memory-mapped).",
                                   labels=["worker"])  # fmt: skip
        gpu = ["worker", "gpu"]
        gpu_used = GaugeMetricFamily("appliance_gpu_memory_used_bytes",
                                     "GPU memory in use (NVML), all processes.",
                                     labels=gpu)  # fmt: skip
        gpu_total = GaugeMetricFamily("appliance_gpu_memory_total_bytes", "GPU memory (NVML).",
                                      labels=gpu)  # fmt: skip
        gpu_own = GaugeMetricFamily("appliance_gpu_memory_process_bytes",
                                    "GPU memory used by the inference worker and its runners.",
                                    labels=gpu)  # fmt: skip
        warm = WarmMemoryFamilies()

        for snap in snapshots:
            worker = str(snap.get("worker") or "")
            for model, engine in (snap.get("models") or {}).items():
                labels = [worker, model]
                for key, family in histograms.items():
                    for extra, histogram in _series(engine, key):
                        family.add_metric([*labels, *extra], _buckets(histogram), histogram["sum"])
                for key, family in totals.items():
                    family.add_metric(labels, (engine.get("totals") or {}).get(key, 0))
                for key, family in gauges.items():
                    family.add_metric(labels, float(engine.get(key) or 0.0))
                for outcome, count in (engine.get("outcomes") or {}).items():
                    outcomes.add_metric([*labels, outcome], count)
                warm.add(labels, engine)
            for runner in snap.get("runners") or []:
                labels = [worker, str(runner.get("model") or "")]
                runner_up.add_metric(labels, 1.0 if runner.get("state") == "running" else 0.0)
                restarts.add_metric(labels, float(runner.get("restarts") or 0))
            loaded.add_metric([worker], len(snap.get("loaded") or []))
            loading.add_metric([worker], 1.0 if snap.get("loading") else 0.0)
            system = snap.get("system") or {}
            rss.add_metric([worker], system.get("rss_bytes") or 0)
            mapped.add_metric([worker], system.get("model_bytes") or 0)
            for reading in system.get("gpus") or []:
                labels = [worker, str(reading.get("index", ""))]
                gpu_used.add_metric(labels, reading.get("used_bytes") or 0)
                gpu_total.add_metric(labels, reading.get("total_bytes") or 0)
                gpu_own.add_metric(labels, reading.get("process_bytes") or 0)

        yield from histograms.values()
        yield from totals.values()
        yield outcomes
        yield from gauges.values()
        yield from (loaded, loading, rss, mapped, gpu_used, gpu_total, gpu_own)
        yield from (runner_up, restarts)
        yield from warm.families()
        yield from gpu_families(snapshots)


# NVML's reading of a card → (gauge name, help, scale).
CARD_GAUGES = {
    "utilization": ("appliance_gpu_utilization_ratio",
                    "Share of the last sample period the GPU was busy (NVML), 0-1.", 0.01),
    "temperature_c": ("appliance_gpu_temperature_celsius", "GPU temperature (NVML).", 1.0),
    "power_w": ("appliance_gpu_power_watts", "GPU power draw (NVML).", 1.0),
    "power_limit_w": ("appliance_gpu_power_limit_watts", "GPU power limit (NVML).", 1.0),
}  # fmt: skip
GPU_PARTS = ("weights", "kv", "compute")


def gpu_families(snapshots: list[dict]) -> Iterator:
    """The GPU figures (docs/metrics.md): per card its load, per runner process its GPU memory
    (NVML) and llama.cpp's own split of it. Labels stay bounded: a worker's cards, its loaded
    models (MAX_LOADED_MODELS) and three parts. A figure nobody reports is left out, never 0:
    on a box without a GPU only appliance_gpus, 0, says so."""
    gpus = GaugeMetricFamily("appliance_gpus", "GPUs NVML sees on the worker's box (0: no GPU).",
                             labels=["worker"])  # fmt: skip
    cards = {key: (GaugeMetricFamily(name, doc, labels=["worker", "gpu"]), scale)
             for key, (name, doc, scale) in CARD_GAUGES.items()}  # fmt: skip
    runner_gpu = GaugeMetricFamily("appliance_runner_gpu_memory_bytes",
                                   "GPU memory of the model's runner process (NVML).",
                                   labels=[*MODEL, "gpu"])  # fmt: skip
    buffers = GaugeMetricFamily("appliance_runner_gpu_buffer_bytes",
                                "What llama.cpp allocated on GPUs for the model, by part "
                                "(weights, kv, compute).", labels=[*MODEL, "part"])  # fmt: skip
    layers = GaugeMetricFamily("appliance_runner_gpu_layers",
                               "Layers llama.cpp put on GPUs (its count: blocks and output).",
                               labels=MODEL)  # fmt: skip
    for snap in snapshots:
        worker = str(snap.get("worker") or "")
        readings = [g for g in (snap.get("system") or {}).get("gpus") or [] if isinstance(g, dict)]
        gpus.add_metric([worker], len(readings))
        models = {row.get("pid"): str(row.get("model") or "") for row in snap.get("runners") or []
                  if isinstance(row, dict) and isinstance(row.get("pid"), int)}  # fmt: skip
        for reading in readings:
            gpu = str(reading.get("index", ""))
            for key, (family, scale) in cards.items():
                if _present(reading.get(key)):
                    family.add_metric([worker, gpu], reading[key] * scale)
            for process in reading.get("processes") or []:
                model = models.get(process.get("pid"))
                if model is not None and _present(process.get("bytes")):
                    runner_gpu.add_metric([worker, model, gpu], process["bytes"])
        for model, engine in (snap.get("models") or {}).items():
            info = engine.get("model") if isinstance(engine, dict) else None
            if not isinstance(info, dict) or not info.get("gpu_offload"):
                continue
            for part, used in (info.get("gpu_buffers") or {}).items():
                if part in GPU_PARTS and _present(used):
                    buffers.add_metric([worker, model, part], used)
            if _present(info.get("gpu_layers")):
                layers.add_metric([worker, model], info["gpu_layers"])
    yield gpus
    for family, _ in cards.values():
        yield family
    yield from (runner_gpu, buffers, layers)


def _present(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render(source: Callable[[], list[dict]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    return generate_latest(registry)


def _snapshots() -> list[dict]:
    return get_client().snapshots()


@api_endpoint(dialect="openai", public=lambda: settings.METRICS_PUBLIC)
async def metrics(request: HttpRequest) -> HttpResponse:
    # Snapshots read NVML and, in split mode, Redis: off the event loop.
    body = await asyncio.to_thread(render, _snapshots)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
