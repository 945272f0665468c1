"""Will a model fit? What loading a GGUF model needs, against what the machine has free.

The estimate has three parts, each an upper bound that is close for llama.cpp:

1. Weights: the tensor data, byte for byte (mmapped on the CPU, copied to the GPU when offloaded).
2. KV cache: 2 (K and V) x layers x n_ctx_total x head_count_kv x head_dim x bytes per element,
   with separate K and V head sizes where the model states them. n_ctx_total is the cells of
   all KV streams together. The runner sets kv_unified = false: every sequence slot (the
   `parallel` running ones plus the prefix cache's cache_slots) has a stream of its own of
   ctx_per_seq cells, so the cache grows with the slots (inference.planning.preflight passes
   ctx_per_seq x slots, after sizing an automatic context per sequence).
   Per-layer head counts count at their maximum, and sliding-window layers at full size,
   so models with either are over- rather than under-estimated.
3. Compute: a fixed 64 MiB for the graph's activations and scratch, plus the logits of one
   micro-batch (n_ubatch x vocab x 4 bytes: llama.cpp reserves the worst case, every token an
   output) and the output buffer (one row of logits per parallel sequence).

4. A vision projector (the model takes images): its weights, byte for byte, and its encoder's
   compute buffer for the largest image it takes (inference.gguf.projector.ProjectorInfo
   .encoder_compute_bytes says how it is reckoned). libmtmd puts both on the GPU when the
   model's layers are offloaded, else in RAM.

With a GPU, layers are offloaded as this llama.cpp does it (llama-model.cpp: the output layer is
layer n_layer, and the last n_gpu_layers of the n_layer + 1 go to the GPU): the output layer
first, then the last n_gpu_layers - 1 blocks with their share of the KV cache; -1 (or more than
n_layer) offloads everything; the token embeddings never. `gpu_layers` counts the blocks. The
GPU part must fit in the GPU's free memory and the rest in free RAM.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from inference.engine.refusals import RefusalKind, Refused
from inference.gguf import GGML_TYPES_BY_NAME, GGUFInfo
from inference.gguf.projector import ProjectorInfo

MiB = 1 << 20
GiB = 1 << 30

COMPUTE_FIXED_BYTES = 64 * MiB
DEFAULT_UBATCH = 512
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")


class InsufficientMemory(Refused):
    """Loading would not fit in free memory; the message gives the numbers."""

    kind = RefusalKind.NO_MEMORY


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    gpu_weights_bytes: int  # the parts that go to the GPU if it offloads (0 when n_gpu_layers=0)
    gpu_kv_cache_bytes: int
    gpu_compute_bytes: int
    n_layers: int
    gpu_layers: int
    n_ctx_total: int
    kv_type: str
    ctx_per_seq: int = 0  # the context per sequence it was sized for (0: not given)
    reason: str = ""  # what the fit chose for these settings, and why (planning.fitting)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_weights_bytes + self.gpu_kv_cache_bytes + self.gpu_compute_bytes

    @property
    def cpu_bytes(self) -> int:
        """What stays in RAM when the GPU takes its part."""
        return self.total_bytes - self.gpu_bytes


@dataclass(frozen=True, slots=True)
class AvailableMemory:
    ram_bytes: int | None  # None: unknown (no psutil)
    gpu_bytes: int | None  # free on all visible GPUs together; None: no GPU, or no NVML
    gpu_count: int = 1  # the visible GPUs that gpu_bytes adds up (each keeps a fitting margin)


def kv_bytes_per_element(kv_type: str) -> Fraction:
    """f16: 2; q8_0: 34/32 (32 values in a block of 34 bytes); q4_0: 18/32."""
    if kv_type.lower() not in KV_TYPES:
        raise ValueError(f"unknown KV cache type {kv_type!r}; one of {', '.join(KV_TYPES)}")
    ggml_type = GGML_TYPES_BY_NAME[kv_type.upper()]
    return Fraction(ggml_type.type_size, ggml_type.block_size)


def estimate_memory(
    info: GGUFInfo,
    *,
    n_ctx_total: int,
    kv_type: str = "f16",
    n_gpu_layers: int = -1,
    parallel: int = 1,
    n_ubatch: int = DEFAULT_UBATCH,
    ctx_per_seq: int = 0,
) -> MemoryEstimate:
    if n_ctx_total <= 0 or parallel <= 0 or n_ubatch <= 0:
        raise ValueError("n_ctx_total, parallel and n_ubatch must be positive")
    n_layers = _required(info.block_count, "block_count")
    kv = _kv_cache_bytes(info, n_layers, n_ctx_total, kv_bytes_per_element(kv_type))
    vocab = info.vocab_size or 0
    compute = COMPUTE_FIXED_BYTES + (n_ubatch + parallel) * vocab * 4

    offloaded = n_layers + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layers + 1)
    gpu_layers = max(0, offloaded - 1)  # blocks: the output layer goes first
    output_on_gpu = offloaded > 0
    return MemoryEstimate(
        weights_bytes=info.weights_bytes,
        kv_cache_bytes=kv,
        compute_bytes=compute,
        gpu_weights_bytes=_gpu_weights_bytes(info, n_layers, gpu_layers, output_on_gpu),
        gpu_kv_cache_bytes=kv * gpu_layers // n_layers,
        gpu_compute_bytes=compute if offloaded else 0,
        n_layers=n_layers,
        gpu_layers=gpu_layers,
        n_ctx_total=n_ctx_total,
        kv_type=kv_type.lower(),
        ctx_per_seq=ctx_per_seq,
    )


def with_draft(estimate: MemoryEstimate, draft: MemoryEstimate) -> MemoryEstimate:
    """A model's estimate with its draft model's (weights, KV and compute, each where it goes)
    added: the two load together in one runner."""
    return dataclasses.replace(
        estimate,
        weights_bytes=estimate.weights_bytes + draft.weights_bytes,
        kv_cache_bytes=estimate.kv_cache_bytes + draft.kv_cache_bytes,
        compute_bytes=estimate.compute_bytes + draft.compute_bytes,
        gpu_weights_bytes=estimate.gpu_weights_bytes + draft.gpu_weights_bytes,
        gpu_kv_cache_bytes=estimate.gpu_kv_cache_bytes + draft.gpu_kv_cache_bytes,
        gpu_compute_bytes=estimate.gpu_compute_bytes + draft.gpu_compute_bytes,
    )


def with_projector(estimate: MemoryEstimate, projector: ProjectorInfo) -> MemoryEstimate:
    """A model's estimate with its vision projector's weights and encoder compute added (part
    4 of the module's), on the GPU where the model's layers go there."""
    on_gpu = estimate.gpu_bytes > 0
    weights, compute = projector.weights_bytes, projector.encoder_compute_bytes
    return dataclasses.replace(
        estimate,
        weights_bytes=estimate.weights_bytes + weights,
        compute_bytes=estimate.compute_bytes + compute,
        gpu_weights_bytes=estimate.gpu_weights_bytes + (weights if on_gpu else 0),
        gpu_compute_bytes=estimate.gpu_compute_bytes + (compute if on_gpu else 0),
    )


def _required(value: int | None, key: str) -> int:
    if not value or value <= 0:
        raise ValueError(f"cannot estimate memory: the model does not state its {key}")
    return value


def _kv_cache_bytes(info: GGUFInfo, n_layers: int, n_ctx: int, per_element: Fraction) -> int:
    head_count_kv = _required(info.head_count_kv, "attention.head_count_kv")
    if info.key_length and info.value_length:
        key_length, value_length = info.key_length, info.value_length
    else:
        embedding = _required(info.embedding_length, "embedding_length")
        head_dim = embedding // _required(info.head_count, "attention.head_count")
        key_length = info.key_length or head_dim
        value_length = info.value_length or head_dim
    elements = n_layers * n_ctx * head_count_kv * (key_length + value_length)
    return -(-elements * per_element.numerator // per_element.denominator)  # ceiling


_BLOCK = re.compile(r"blk\.(\d+)\.")


def _gpu_weights_bytes(info: GGUFInfo, n_layers: int, gpu_layers: int, output_on_gpu: bool) -> int:
    first_gpu_layer = n_layers - gpu_layers
    total = 0
    has_output = False
    for t in info.tensors:
        block = _BLOCK.match(t.name)
        if block:
            total += t.nbytes if int(block.group(1)) >= first_gpu_layer else 0
        elif t.name.startswith("token_embd"):
            continue  # the input layer stays on the CPU
        elif output_on_gpu:
            total += t.nbytes
            has_output = has_output or t.name == "output.weight"
    if output_on_gpu and not has_output:
        # Tied embeddings: llama.cpp puts a copy of token_embd on the GPU as the output layer.
        total += sum(t.nbytes for t in info.tensors if t.name == "token_embd.weight")
    return total


def check_fits(estimate: MemoryEstimate, available: AvailableMemory) -> None:
    """Raises InsufficientMemory, with the numbers, if the model cannot be loaded."""
    uses_gpu = available.gpu_bytes is not None and estimate.gpu_bytes > 0
    if uses_gpu and estimate.gpu_bytes > available.gpu_bytes:
        parts = (
            estimate.gpu_weights_bytes,
            estimate.gpu_kv_cache_bytes,
            estimate.gpu_compute_bytes,
        )
        size = _formatter(estimate.gpu_bytes, available.gpu_bytes)
        raise InsufficientMemory(
            f"needs {size(estimate.gpu_bytes)} of GPU memory for {estimate.gpu_layers} of "
            f"{estimate.n_layers} layers ({_parts(parts, size)}) but only "
            f"{size(available.gpu_bytes)} is free on the GPU"
        )
    if uses_gpu:  # the rest stays in RAM
        parts = (
            estimate.weights_bytes - estimate.gpu_weights_bytes,
            estimate.kv_cache_bytes - estimate.gpu_kv_cache_bytes,
            estimate.compute_bytes - estimate.gpu_compute_bytes,
        )
    else:
        parts = (estimate.weights_bytes, estimate.kv_cache_bytes, estimate.compute_bytes)
    needed = sum(parts)
    if available.ram_bytes is not None and needed > available.ram_bytes:
        size = _formatter(needed, available.ram_bytes)
        raise InsufficientMemory(
            f"needs {size(needed)} ({_parts(parts, size)}) "
            f"but only {size(available.ram_bytes)} of RAM is free"
        )


def _parts(parts: tuple[int, int, int], size: Callable[[int], str]) -> str:
    weights, kv, compute = parts
    return f"weights {size(weights)} + KV cache {size(kv)} + compute {size(compute)}"


def _formatter(*numbers: int) -> Callable[[int], str]:
    """One unit for a whole message, so its numbers add up at a glance: GiB with one decimal
    when any number reaches 1 GiB, else whole MiB (a 135M model is ~100 MiB)."""
    if max(numbers) >= GiB:
        return lambda n: f"{n / GiB:.1f} GiB"
    return lambda n: f"{n / MiB:.0f} MiB"
