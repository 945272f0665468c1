"""Fitting a model to the memory this box has free, before a load: the context per sequence, and
with a GPU also the KV cache type, the layers on the GPU and the batch, the way llama-server's
`--fit` does it (context first, then the KV type, then layers). Each choice is said in
`Fitted.reason`, which the model page shows under its estimate.

On the CPU, or with the GPU layers set on the model's page (n_gpu_layers 0 or more), only an
automatic context (n_ctx 0) is sized: the training context, at most AUTO_CTX_MAX, halved until
the whole estimate (weights, the KV cache of every sequence slot, compute) fits in
AUTO_MEMORY_SHARE of the free memory, never below AUTO_CTX_FLOOR (or the training context when
that is smaller). The share leaves room for the OS, other models and a request that asks for
more (Ollama's num_ctx, a spec's `min_ctx`).

With a GPU and n_gpu_layers -1 ("every layer the card takes"), against the card's free memory
less GPU_MARGIN_BYTES per GPU (llama-server's --fit-target: CUDA's own context, the desktop and
other programs), and AUTO_MEMORY_SHARE of the free RAM for what stays there:
1. Context: the largest of the automatic context's halvings (or the context set on the page)
   with which every layer and the whole KV cache fit on the card, the KV cache in f16.
2. KV type: if not even the floor fits, the KV cache in q8_0 (34/64 of f16's bytes; llama.cpp
   quantises V only with flash attention, so only with it on), again the largest context.
3. Layers: if not even that fits, the most layers that do at the floor in q8_0; the rest, and
   their share of the KV cache, stay in RAM: slower, but loaded.
4. Batch: with every layer on the GPU, a batch at its default (512) becomes GPU_BATCH (2048,
   llama-server's default). On a GPU a step of 2048 prompt tokens costs little more than one of
   512 (the matrices are still far from filling the card), so a long prompt takes a quarter of
   the steps, and each step's overhead a quarter of the time; the engine's step-cost model still
   sizes every step that carries a stream to the ITL target (inference.engine.budget), so the
   stream keeps its pace. The micro-batch stays at its setting: the compute buffer grows with
   it, and the estimate holds as it is.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from inference.engine.runner_config import DEFAULT_N_BATCH
from inference.gguf import GGUFInfo
from inference.planning.memory import (
    AvailableMemory,
    GiB,
    InsufficientMemory,
    MemoryEstimate,
    MiB,
    check_fits,
)

AUTO_CTX_MAX = 32768
AUTO_CTX_FLOOR = 2048
AUTO_MEMORY_SHARE = Fraction(3, 4)
GPU_MARGIN_BYTES = GiB  # left free on each GPU (llama-server's --fit-target default)
GPU_BATCH = 2048  # n_batch with every layer on a GPU (llama-server's default)
SMALLER_KV = "q8_0"


@dataclass(frozen=True, slots=True)
class Fitted:
    """The settings a load gets, the estimate they were checked with, and why."""

    ctx_per_seq: int
    kv_type: str
    n_gpu_layers: int
    n_batch: int
    estimate: MemoryEstimate | None  # None: the metadata does not say enough to size it
    reason: str  # empty when nothing was chosen (every setting as the page has it)

    def applied_to(self, config):
        """A RunnerConfig with these settings."""
        return dataclasses.replace(
            config, ctx_per_seq=self.ctx_per_seq, kv_type=self.kv_type,
            n_gpu_layers=self.n_gpu_layers, n_batch=self.n_batch,
        )  # fmt: skip


def fit(info: GGUFInfo, settings: dict, available: AvailableMemory, *,
        estimate: Callable[..., MemoryEstimate | None], min_ctx: int = 0) -> Fitted:  # fmt: skip
    """The settings for a load (module docstring). `settings`: a RunnerConfig's, as
    inference.planning.preflight passes them (ctx_per_seq 0: automatic); `estimate(info,
    **settings)` sizes one candidate (None when the metadata cannot)."""
    if available.gpu_bytes is not None and settings["n_gpu_layers"] < 0:
        return _fit_to_gpu(info, settings, available, min_ctx, estimate)
    return _fit_context(info, settings, available, min_ctx, estimate)


def contexts(info: GGUFInfo, min_ctx: int = 0) -> list[int]:
    """The automatic context's candidates, largest first: the training context (at most
    AUTO_CTX_MAX) halved down to the floor; none below what a request asked for (`min_ctx`)."""
    trained = info.context_length or AUTO_CTX_FLOOR
    floor = min(AUTO_CTX_FLOOR, trained)
    ctx, found = min(trained, AUTO_CTX_MAX), []
    while ctx > floor:
        found.append(ctx)
        ctx //= 2
    found.append(floor)
    return sorted({max(c, min_ctx) for c in found}, reverse=True)


def _share(available: AvailableMemory) -> AvailableMemory:
    def part(free: int | None) -> int | None:
        return None if free is None else int(free * AUTO_MEMORY_SHARE)

    return dataclasses.replace(available, ram_bytes=part(available.ram_bytes),
                               gpu_bytes=part(available.gpu_bytes))  # fmt: skip


def _fits(estimate: MemoryEstimate, room: AvailableMemory) -> bool:
    try:
        check_fits(estimate, room)
    except InsufficientMemory:
        return False
    return True


def _fit_context(info, settings, available, min_ctx, estimate) -> Fitted:
    """The CPU's fit, and a GPU's with layers set on the page: an automatic context only."""
    kept = {k: settings[k] for k in ("kv_type", "n_gpu_layers", "n_batch")}
    asked = settings["ctx_per_seq"]
    if asked:
        ctx = max(asked, min_ctx)
        return Fitted(ctx, **kept, estimate=estimate(info, **{**settings, "ctx_per_seq": ctx}),
                      reason="")  # fmt: skip
    share = _share(available)
    where = "RAM" if available.gpu_bytes is None else "free memory"
    free = available.ram_bytes if available.gpu_bytes is None else None
    candidates = contexts(info, min_ctx)
    tried = []
    for ctx in candidates:
        found = estimate(info, **{**settings, "ctx_per_seq": ctx})
        if found is None:  # nothing to size it by: the floor
            return Fitted(candidates[-1], **kept, estimate=None, reason="")
        if _fits(found, share):
            why = _ctx_words(info, ctx, tried, 0, min_ctx)
            of = f" of the free {where}" + (f" ({_size(free)})" if free is not None else "")
            return Fitted(ctx, **kept, estimate=found, reason=(
                f"automatic context: {ctx} tokens per sequence ({why}), the most that fits "
                f"in 3/4{of}"))  # fmt: skip
        tried.append(ctx)
    ctx = candidates[-1]
    return Fitted(ctx, **kept, estimate=found, reason=(
        f"automatic context: {ctx} tokens per sequence, the floor: not even that fits in 3/4 "
        f"of the free {where}"))  # fmt: skip


def _fit_to_gpu(info, settings, available, min_ctx, estimate) -> Fitted:
    """Steps 1 to 4 of the module docstring."""
    margin = GPU_MARGIN_BYTES * max(1, available.gpu_count)
    room = AvailableMemory(
        ram_bytes=_share(available).ram_bytes, gpu_bytes=max(0, available.gpu_bytes - margin)
    )
    asked = settings["ctx_per_seq"]
    candidates = [max(asked, min_ctx)] if asked else contexts(info, min_ctx)
    kv = settings["kv_type"]
    kv_types = [kv] + ([SMALLER_KV] if kv == "f16" and settings.get("flash_attn", True) else [])
    card = (f"fitted to the GPU ({_size(available.gpu_bytes)} free, less a "
            f"{_size(margin)} margin)")  # fmt: skip

    def sized(ctx: int, kv_type: str, layers: int) -> MemoryEstimate | None:
        return estimate(info, **{**settings, "ctx_per_seq": ctx, "kv_type": kv_type,
                                 "n_gpu_layers": layers})  # fmt: skip

    tried: dict[str, list[int]] = {}
    for kv_type in kv_types:
        for ctx in candidates:
            found = sized(ctx, kv_type, -1)
            if found is None:
                return Fitted(candidates[-1], kv, -1, settings["n_batch"], None, "")
            if _fits(found, room):
                why = _ctx_words(info, ctx, tried.get(kv_type, []), asked, min_ctx)
                return _whole(settings, ctx, kv_type, found, card, why,
                              _kv_words(kv, kv_type, candidates[-1]))  # fmt: skip
            tried.setdefault(kv_type, []).append(ctx)
    ctx, kv_type = candidates[-1], kv_types[-1]
    layers, found = 0, sized(ctx, kv_type, 0)
    for n in range(found.n_layers, 0, -1):  # llama.cpp's count: n_layers + 1 is every layer
        candidate = sized(ctx, kv_type, n)
        if _fits(candidate, room):
            layers, found = n, candidate
            break
    ctx_words = "as set" if asked else "the floor"
    return Fitted(ctx, kv_type, layers, settings["n_batch"], found, (
        f"{card}: {ctx} tokens per sequence ({ctx_words}), KV cache {kv_type}"
        f"{_kv_words(kv, kv_type, ctx)}, {layers} of {found.n_layers + 1} layers on the GPU "
        f"(llama.cpp's count: the blocks and the output layer), the rest in RAM: not every "
        f"layer fits even so"))  # fmt: skip


def _whole(settings, ctx, kv_type, found, card, ctx_words, kv_words) -> Fitted:
    """Every layer on the GPU, and the batch of step 4."""
    n_batch = settings["n_batch"]
    batch_words = ""
    if n_batch == DEFAULT_N_BATCH and settings["n_ubatch"] <= DEFAULT_N_BATCH:
        n_batch = GPU_BATCH
        batch_words = f"; prompts are read up to {GPU_BATCH} tokens a step"
    return Fitted(ctx, kv_type, -1, n_batch, found, (
        f"{card}: {ctx} tokens per sequence ({ctx_words}), KV cache {kv_type}{kv_words}, "
        f"every layer on the GPU{batch_words}"))  # fmt: skip


def _ctx_words(info: GGUFInfo, ctx: int, tried: list[int], asked: int, min_ctx: int) -> str:
    """Why this context per sequence, in a few words."""
    if asked:
        return "as set"
    if tried:
        return f"{tried[-1]} did not fit"
    if ctx == (info.context_length or AUTO_CTX_FLOOR):
        return "the training context"
    if ctx == min_ctx:
        return "as a request asked"
    return f"the automatic context's most, {AUTO_CTX_MAX}"


def _kv_words(asked: str, chosen: str, floor: int) -> str:
    return "" if asked == chosen else f" ({asked} did not fit even at {floor} tokens)"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"
