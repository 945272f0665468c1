"""A real, loadable M-RoPE vision model for tests: a tiny Qwen2-VL language model (architecture
`qwen2vl`, rope type M-RoPE, `rope.dimension_sections`) with the starter's tokenizer, and a tiny
`qwen2vl_merger` projector beside it, both with random weights, written with the `gguf` package.

With M-RoPE an image of nx x ny merged patches is nx * ny tokens that take max(nx, ny) positions
(libmtmd's mtmd_image_tokens_get_n_pos), so this pair is what tests of positions that are not
token indexes run on. Its answers are meaningless but deterministic.

Facts of the pinned llama.cpp it is written to:
- the `qwen2vl` language model is `qwen2`'s tensors (q/k/v with biases, gated FFN) and reads
  `rope.dimension_sections`, four counts of rotated pairs that sum to at most half a head;
- the `qwen2vl_merger` tower has no class embedding and no position embedding (its attention
  is rotated with 2-D positions); its patch embedding is two convolutions, `v.patch_embd.weight`
  and `v.patch_embd.weight.1`, added; its blocks are `ln1`/`ln2` (layer norm), `attn_q/k/v/out`
  and `ffn_up/down`, all with biases; `mm.0` takes four merged patches (4 x the tower's width)
  and `mm.2` gives the model's `n_embd`;
- pictures are resized to multiples of 28 pixels (patch 14, merged 2 x 2), at least 8 tokens.
"""

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

EMBED, HEADS, HEADS_KV, LAYERS, FF, CONTEXT = 64, 4, 2, 2, 128, 4096
SECTIONS = (2, 3, 3, 0)  # rotated pairs per M-RoPE section: head 16, so at most 8 in all
V_EMBED, V_HEADS, V_FF, V_BLOCKS, V_HIDDEN, PATCH = 32, 2, 48, 2, 128, 14

_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)  # fmt: skip


def _copy_field(writer: GGUFWriter, reader: GGUFReader, key: str) -> None:
    field = reader.fields.get(key)
    if field is None:
        return
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        inner = field.types[-1]
        if inner == GGUFValueType.STRING:
            values = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            values = [int(field.parts[i][0]) for i in field.data]
        writer.add_array(key, values)
    elif kind == GGUFValueType.STRING:
        writer.add_string(key, bytes(field.parts[-1]).decode("utf-8"))
    elif kind == GGUFValueType.BOOL:
        writer.add_bool(key, bool(field.parts[-1][0]))
    else:
        writer.add_uint32(key, int(field.parts[-1][0]))


def write_language_model(path: Path, starter: Path, *, seed: int = 5) -> Path:
    """A tiny `qwen2vl` language model at `path`, with the tokenizer of the model at `starter`."""
    reader = GGUFReader(starter)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head = EMBED // HEADS
    writer = GGUFWriter(path, "qwen2vl")
    writer.add_name("tiny qwen2vl")
    writer.add_file_type(1)  # f16 token embeddings, the rest f32
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS_KV)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_sections(list(SECTIONS))
    for key in _TOKENIZER_KEYS:
        _copy_field(writer, reader, key)

    writer.add_tensor("token_embd.weight", weights(n_vocab, EMBED, scale=1.0).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    kv = HEADS_KV * head
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weights(EMBED, EMBED, scale=0.3))
        writer.add_tensor(f"blk.{i}.attn_q.bias", weights(EMBED, scale=0.1))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weights(kv, EMBED, scale=0.3))
        writer.add_tensor(f"blk.{i}.attn_k.bias", weights(kv, scale=0.1))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weights(kv, EMBED, scale=0.3))
        writer.add_tensor(f"blk.{i}.attn_v.bias", weights(kv, scale=0.1))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weights(EMBED, EMBED, scale=0.2))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(FF, EMBED, scale=0.2))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(FF, EMBED, scale=0.2))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(EMBED, FF, scale=0.2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_projector(path: Path, *, seed: int = 13) -> Path:
    """A tiny `qwen2vl_merger` projector for write_language_model's model, at `path`."""
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = GGUFWriter(path, "clip")
    writer.add_name("tiny qwen2vl projector")
    writer.add_file_type(0)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", "qwen2vl_merger")
    writer.add_uint32("clip.vision.image_size", 560)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", V_EMBED)
    writer.add_uint32("clip.vision.feed_forward_length", V_FF)
    writer.add_uint32("clip.vision.block_count", V_BLOCKS)
    writer.add_uint32("clip.vision.projection_dim", EMBED)
    writer.add_uint32("clip.vision.attention.head_count", V_HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.481, 0.458, 0.408])
    writer.add_array("clip.vision.image_std", [0.269, 0.261, 0.276])

    # numpy shapes are ggml's reversed: a (rows, cols) matrix is ne = [cols, rows].
    writer.add_tensor("v.patch_embd.weight", weights(V_EMBED, 3, PATCH, PATCH))
    writer.add_tensor("v.patch_embd.weight.1", weights(V_EMBED, 3, PATCH, PATCH))
    for i in range(V_BLOCKS):
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{norm}.weight", np.ones(V_EMBED, dtype=np.float32))
            writer.add_tensor(f"v.blk.{i}.{norm}.bias", np.zeros(V_EMBED, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", weights(V_EMBED, V_EMBED, scale=0.2))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", weights(V_EMBED, scale=0.01))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", weights(V_FF, V_EMBED, scale=0.2))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", weights(V_FF, scale=0.01))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", weights(V_EMBED, V_FF, scale=0.2))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", weights(V_EMBED, scale=0.01))
    writer.add_tensor("mm.0.weight", weights(V_HIDDEN, 4 * V_EMBED, scale=1 / np.sqrt(4 * V_EMBED)))
    writer.add_tensor("mm.0.bias", np.zeros(V_HIDDEN, dtype=np.float32))
    # Image rows about as long as a token embedding's (sqrt(EMBED) for unit-normal rows), so an
    # image changes the answer.
    writer.add_tensor("mm.2.weight", weights(EMBED, V_HIDDEN, scale=2.0 / np.sqrt(V_HIDDEN)))
    writer.add_tensor("mm.2.bias", np.zeros(EMBED, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
