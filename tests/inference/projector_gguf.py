"""A real, loadable vision projector for the starter: a tiny CLIP tower with a LLaVA-1.5 style
`mlp` projector (random weights), written with the `gguf` package. libmtmd loads it beside the
starter and encodes images with it; its answers are meaningless but deterministic, which is
what a test of the image path wants.

Facts of the pinned llama.cpp it is written to (issue 29, "Tests on this box"):
- `mlp` needs no special tokens in the language model's vocabulary (idefics3's looks up tokens
  the starter lacks);
- the CLIP tower is `v.patch_embd`, `v.class_embd`, `v.position_embd`, `v.pre_ln`, then blocks
  of `ln1`/`ln2`, `attn_q/k/v/out` and `ffn_up/down`, all with biases; the projector is `mm.0`
  and `mm.2`, `mm.2`'s output as wide as the model's `n_embd`;
- `projection_dim`, `image_mean` and `image_std` are required;
- the FFN width differs from the embedding width;
- at image_size 112 and patch_size 14 an image is (112 / 14)^2 = 64 tokens; the llava graph
  stops one block before the last, so there are two blocks;
- `mm.2` is scaled so the image embeddings have about the norm of the model's token embeddings,
  or an image would barely change the answer.
"""

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

IMAGE_SIZE, PATCH_SIZE = 112, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 64
EMBED, HEADS, FF, BLOCKS, HIDDEN = 64, 4, 96, 2, 128


def model_embedding(model: Path) -> tuple[int, float]:
    """The language model's n_embd and the mean norm of its token embeddings (a sample), read
    from its GGUF header and data."""
    reader = GGUFReader(model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_embd = int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])
    norm = 1.0
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            from gguf import dequantize

            rows = dequantize(tensor.data[:256], tensor.tensor_type).reshape(-1, n_embd)
            norm = float(np.linalg.norm(rows, axis=1).mean())
            break
    return n_embd, norm


def write_projector(
    path: Path,
    model: Path,
    *,
    n_embd: int | None = None,
    projector_type: str = "mlp",
    seed: int = 11,
    image_size: int = IMAGE_SIZE,
    patch_size: int = PATCH_SIZE,
    embed: int = EMBED,
    heads: int = HEADS,
    ff: int = FF,
    blocks: int = BLOCKS,
    hidden: int = HIDDEN,
    f16: bool = False,
) -> Path:
    """A tiny projector for the language model at `model`, written to `path`. `n_embd` other
    than the model's makes one whose projection does not fit it; `projector_type` other than
    "mlp" one that llama.cpp may not know. The tower's sizes (`blocks` run, the file holding
    one more) may be given for a larger encoder (bench/vision.py's ViT-B-sized one), with
    `f16` matrices to keep such a file small."""
    model_embd, token_norm = model_embedding(model)
    out = n_embd or model_embd
    n_pos = (image_size // patch_size) ** 2 + 1  # the patches and the class embedding
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def matrix(*shape: int, scale: float = 0.05) -> np.ndarray:
        return weights(*shape, scale=scale).astype(np.float16 if f16 else np.float32)

    writer = GGUFWriter(path, "clip")
    writer.add_name("tiny projector")
    writer.add_file_type(1 if f16 else 0)  # f16 matrices, or all f32
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", projector_type)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", embed)
    writer.add_uint32("clip.vision.feed_forward_length", ff)
    writer.add_uint32("clip.vision.block_count", blocks + 1)  # the last block is not run
    writer.add_uint32("clip.vision.projection_dim", out)
    writer.add_uint32("clip.vision.attention.head_count", heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.481, 0.458, 0.408])
    writer.add_array("clip.vision.image_std", [0.269, 0.261, 0.276])
    # No clip.vision.feature_layer: the llava graph then runs every block but the last, as
    # LLaVA-1.5's projectors do; a feature layer of 0 would stop it before the first block (an
    # encoder that costs nothing, where a ViT-B-sized one must cost what ViT-B costs).

    # numpy shapes are ggml's reversed: a (rows, cols) matrix is ne = [cols, rows].
    writer.add_tensor("v.patch_embd.weight", matrix(embed, 3, patch_size, patch_size))
    writer.add_tensor("v.class_embd", weights(embed))
    writer.add_tensor("v.position_embd.weight", weights(n_pos, embed))
    writer.add_tensor("v.pre_ln.weight", np.ones(embed, dtype=np.float32))
    writer.add_tensor("v.pre_ln.bias", np.zeros(embed, dtype=np.float32))
    for i in range(blocks + 1):
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{norm}.weight", np.ones(embed, dtype=np.float32))
            writer.add_tensor(f"v.blk.{i}.{norm}.bias", np.zeros(embed, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", matrix(embed, embed))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", weights(embed, scale=0.01))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", matrix(ff, embed))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", weights(ff, scale=0.01))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", matrix(embed, ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", weights(embed, scale=0.01))
    writer.add_tensor("mm.0.weight", matrix(hidden, embed, scale=1 / np.sqrt(embed)))
    writer.add_tensor("mm.0.bias", np.zeros(hidden, dtype=np.float32))
    # The tower's output is layer-normed (about unit scale per element), mm.0 keeps that scale
    # and GELU leaves about 0.6 of it: mm.2 is scaled so that each image embedding's norm is
    # about a token embedding's.
    mm2_scale = token_norm / (0.6 * np.sqrt(hidden) * np.sqrt(out))
    writer.add_tensor("mm.2.weight", matrix(out, hidden, scale=float(mm2_scale)))
    writer.add_tensor("mm.2.bias", np.zeros(out, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def picture(width: int = 64, height: int = 48, *, seed: int = 3, kind: str = "png") -> bytes:
    """A small deterministic picture, encoded as `kind` (png or bmp), written without an image
    library: noise over a gradient, so two seeds give two different images."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1),
                     (x + y) * 255 // max(1, width + height - 2)], axis=-1)  # fmt: skip
    pixels = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    if kind == "bmp":
        return _bmp(pixels)
    return _png(pixels)


def _png(pixels: np.ndarray) -> bytes:
    import struct
    import zlib

    height, width, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[row].tobytes() for row in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))  # fmt: skip

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))  # fmt: skip


def _bmp(pixels: np.ndarray) -> bytes:
    import struct

    height, width, _ = pixels.shape
    row_bytes = (width * 3 + 3) & ~3
    bottom_up = range(height - 1, -1, -1)
    rows = b"".join(pixels[row, :, ::-1].tobytes().ljust(row_bytes, b"\x00") for row in bottom_up)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    header = struct.pack("<2sIHHI", b"BM", 14 + len(info) + len(rows), 0, 0, 14 + len(info))
    return header + info + rows
