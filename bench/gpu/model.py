"""The model the GPU check runs: the starter model's tokenizer and chat template on a llama of a
chosen shape, with random weights, made on the machine that runs the check.

The starter model (SmolLM2-135M, 98 MB) does not fit in the 60 MB the check may carry, and a
135M model on a data-centre GPU measures Python's overhead more than the GPU. So prepare.py
carries a skeleton: the starter's metadata alone (tokenizer, chat template; ~2 MB), and the
check writes a model of SHAPES["gpu"] around it (a 1.7B-class llama, Q4_0, ~0.9 GB) in seconds.
llama.cpp's work per token does not depend on the weights' values, so its speeds are a real
model's; the answers are nonsense, and the output rows of the control tokens are zero, so that
greedy decoding never picks an end-of-generation token (a stream ends at its token count, as
the benchmark's streams must).

Needs numpy and the `gguf` package (carried as a wheel).
"""

import math
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

SHAPES = {
    # SmolLM2-1.7B's width and depth with grouped-query attention (8 KV heads): 1.66B
    # parameters, 0.93 GB in Q4_0.
    "gpu": dict(block_count=24, embedding_length=2048, feed_forward_length=8192, head_count=32,
                head_count_kv=8, context_length=16384),
    # A few MB, for the check's dry run on a CPU.
    "tiny": dict(block_count=4, embedding_length=256, feed_forward_length=768, head_count=4,
                 head_count_kv=2, context_length=16384),
}  # fmt: skip
# A shape's names -> the GGUF keys of a llama.
KEYS = {"block_count": "llama.block_count", "embedding_length": "llama.embedding_length",
        "feed_forward_length": "llama.feed_forward_length",
        "head_count": "llama.attention.head_count",
        "head_count_kv": "llama.attention.head_count_kv",
        "context_length": "llama.context_length"}  # fmt: skip
SHAPE_KEYS = set(KEYS.values()) | {"llama.rope.dimension_count"}
Q4_0_BLOCK, Q4_0_BYTES = 32, 18  # 32 values: an f16 scale and 16 bytes of 4-bit values
CONTROL = 3  # tokenizer.ggml.token_type of a control token (<|im_end|>, <|endoftext|>, ...)


def write_skeleton(source: Path, dest: Path) -> None:
    """The metadata of `source` (every key, no tensors): what the check builds a model on."""
    reader = GGUFReader(str(source))
    writer = GGUFWriter(str(dest), arch=_value(reader, "general.architecture"))
    _copy_fields(reader, writer, skip=set())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def synthesize(skeleton: Path, dest: Path, shape: str = "gpu", seed: int = 0) -> dict:
    """Write a model of SHAPES[shape] with the skeleton's tokenizer; returns its facts."""
    dims = SHAPES[shape]
    reader = GGUFReader(str(skeleton))
    writer = GGUFWriter(str(dest), arch="llama")
    _copy_fields(reader, writer, skip=SHAPE_KEYS | {"general.name", "general.size_label",
                                                    "general.file_type"})  # fmt: skip
    n_embd, n_ff = dims["embedding_length"], dims["feed_forward_length"]
    n_head, n_kv = dims["head_count"], dims["head_count_kv"]
    head_dim = n_embd // n_head
    for name, value in dims.items():
        writer.add_uint32(KEYS[name], value)
    writer.add_uint32("llama.rope.dimension_count", head_dim)
    writer.add_string("general.name", f"gpu-check-{shape}")
    writer.add_uint32("general.file_type", 2)  # MOSTLY_Q4_0
    tokens = _value(reader, "tokenizer.ggml.tokens")
    types = _value(reader, "tokenizer.ggml.token_type")
    n_vocab = len(tokens)
    control = [i for i, kind in enumerate(types) if kind == CONTROL]

    rng = np.random.default_rng(seed)
    ones = np.ones(n_embd, dtype=np.float32)
    params = 0

    def matrix(name: str, n_in: int, n_out: int, silent_rows=()) -> None:
        nonlocal params
        writer.add_tensor(name, _q4_0(rng, n_out, n_in, silent_rows),
                          raw_dtype=GGMLQuantizationType.Q4_0)  # fmt: skip
        params += n_in * n_out

    matrix("token_embd.weight", n_embd, n_vocab)
    for i in range(dims["block_count"]):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        matrix(f"blk.{i}.attn_q.weight", n_embd, n_head * head_dim)
        matrix(f"blk.{i}.attn_k.weight", n_embd, n_kv * head_dim)
        matrix(f"blk.{i}.attn_v.weight", n_embd, n_kv * head_dim)
        matrix(f"blk.{i}.attn_output.weight", n_head * head_dim, n_embd)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        matrix(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
        matrix(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        matrix(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
    writer.add_tensor("output_norm.weight", ones)
    matrix("output.weight", n_embd, n_vocab, silent_rows=control)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"shape": shape, **dims, "n_vocab": n_vocab, "params": params,
            "file_bytes": dest.stat().st_size}  # fmt: skip


def _q4_0(rng, rows: int, n_in: int, silent_rows=()) -> np.ndarray:
    """`rows` rows of `n_in` random Q4_0 values, as bytes (rows, blocks x 18). Values d*(q-8)
    for q uniform in 0..15 have a standard deviation of about 4.6 d: d is chosen so that a row
    times a unit vector stays near 1 (1/sqrt(n_in)), as trained weights keep activations."""
    blocks = n_in // Q4_0_BLOCK
    scale = np.float16(1.0 / (4.6 * math.sqrt(n_in)))
    data = np.empty((rows, blocks, Q4_0_BYTES), dtype=np.uint8)
    data[:, :, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    data[:, :, 2:] = rng.integers(0, 256, size=(rows, blocks, 16), dtype=np.uint8)
    for row in silent_rows:
        data[row, :, :2] = 0  # a zero scale: this token's logit is 0, below the random others
    return data.reshape(rows, blocks * Q4_0_BYTES)


def _value(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def _copy_fields(reader: GGUFReader, writer: GGUFWriter, skip: set[str]) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
