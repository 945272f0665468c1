"""A real, loadable draft model for the starter: a tiny llama (2 layers, 64 wide, random
weights) with the starter's tokenizer copied over, written with the `gguf` package. llama.cpp
loads and runs it; its guesses are poor, which is what a test of verification wants."""

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

EMBED, LAYERS, HEADS, FF = 64, 2, 4, 128


def _strings(field) -> list[str]:
    return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]


def _values(field) -> list:
    return [field.parts[i].tolist()[0] for i in field.data]


def write_draft(path: Path, starter: Path, *, bos_token_id: int | None = None) -> Path:
    """A tiny draft model for `starter` at `path`; `bos_token_id` other than the starter's
    makes one llama.cpp must refuse to draft with."""
    reader = GGUFReader(starter)
    fields = reader.fields
    tokens = _strings(fields["tokenizer.ggml.tokens"])
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny draft")
    writer.add_context_length(2048)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(EMBED)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model(bytes(fields["tokenizer.ggml.model"].parts[-1]).decode())
    if "tokenizer.ggml.pre" in fields:
        writer.add_tokenizer_pre(bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode())
    writer.add_token_list(tokens)
    writer.add_token_types(_values(fields["tokenizer.ggml.token_type"]))
    if "tokenizer.ggml.merges" in fields:
        writer.add_token_merges(_strings(fields["tokenizer.ggml.merges"]))
    for key, add in (("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
                     ("tokenizer.ggml.padding_token_id", writer.add_pad_token_id),
                     ("tokenizer.ggml.unknown_token_id", writer.add_unk_token_id)):  # fmt: skip
        if key in fields:
            add(int(fields[key].parts[-1][0]))
    if bos_token_id is not None:
        writer.add_key_value("tokenizer.ggml.bos_token_id", bos_token_id, GGUFValueType.UINT32)
    rng = np.random.default_rng(7)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(len(tokens), EMBED))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(EMBED, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(FF, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(FF, EMBED))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(EMBED, FF))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
