"""Vision projectors: whether a GGUF that libmtmd would load beside a language model is one it
can use, read from the header alone (the validating reader) before libmtmd ever reads it.

A projector passes when
1. it is a CLIP file (general.architecture "clip") with a vision encoder
   (clip.has_vision_encoder);
2. its projector type is one this llama.cpp knows and encodes images with (VISION_PROJECTORS,
   from tools/mtmd/clip-impl.h's PROJECTOR_TYPE_NAMES; the audio and speech ones are refused
   with that said);
3. its projection width is the language model's n_embd: clip.vision.projection_dim, and the
   output width of the last projector tensor where the type names one (OUTPUT_TENSORS; the
   width libmtmd checks against the model's n_embd_inp before its first image);
4. its sizes are bounded (SIZE_BOUNDS): a hostile header must not make the encoder's buffers,
   reckoned from them, absurd.

Anything else is a ProjectorError (a GGUFError) naming what is wrong. Imports no Django: the
host's preflight runs it where the engine runs.
"""

from dataclasses import dataclass

from inference.gguf.reader import GGUFError, GGUFInfo

CLIP_ARCHITECTURE = "clip"

# The vision projector types of the pinned llama.cpp (PROJECTOR_TYPE_NAMES, tools/mtmd/
# clip-impl.h) and the models they come with. "qwen2.5o" is Qwen2.5-Omni's mixed file, read as
# qwen2.5vl_merger for images.
VISION_PROJECTORS: dict[str, str] = {
    "mlp": "LLaVA-1.5 and its likes", "ldp": "MobileVLM", "ldpv2": "MobileVLM V2",
    "resampler": "MiniCPM-V", "adapter": "GLM-Edge-V", "qwen2vl_merger": "Qwen2-VL",
    "qwen2.5vl_merger": "Qwen2.5-VL", "qwen3vl_merger": "Qwen3-VL", "ling3vl": "Ling 3 VL",
    "step3vl": "Step3-VL", "gemma3": "Gemma 3", "gemma3nv": "Gemma 3n", "gemma4v": "Gemma 4",
    "gemma4uv": "Gemma 4", "phi4": "Phi-4 multimodal", "idefics3": "SmolVLM, Idefics3",
    "pixtral": "Pixtral, Mistral Small 3.1", "internvl": "InternVL", "llama4": "Llama 4",
    "qwen2.5o": "Qwen2.5-Omni", "lfm2": "LFM2-VL", "kimivl": "Kimi-VL",
    "paddleocr": "PaddleOCR-VL", "lightonocr": "LightOnOCR", "cogvlm": "CogVLM",
    "janus_pro": "Janus-Pro", "dots_ocr": "dots.ocr", "dots3note_v": "dots3note",
    "deepseekocr": "DeepSeek-OCR", "deepseekocr2": "DeepSeek-OCR 2",
    "deepseek4v": "DeepSeek 4 V", "glm4v": "GLM-4V", "glm5v": "GLM-5V", "youtuvl": "Youtu-VL",
    "yasa2": "YaSa 2", "kimik25": "Kimi K2.5", "nemotron_v2_vl": "Nemotron V2 VL",
    "exaone4_5": "EXAONE 4.5", "hunyuanvl": "HunyuanVL", "minicpmv4_6": "MiniCPM-V 4.6",
    "mimovl": "MiMo-VL", "minimax_m3": "MiniMax M3", "granite4_vision": "Granite 4 Vision",
    "muse-glimmer": "Muse Glimmer",
}  # fmt: skip
# The other types of PROJECTOR_TYPE_NAMES: llama.cpp knows them, but they encode sound.
AUDIO_PROJECTORS = frozenset({
    "gemma3na", "gemma4a", "gemma4ua", "ultravox", "qwen2a", "qwen3a", "glma", "voxtral",
    "meralion", "musicflamingo", "lfm2a", "granite_speech", "mimo_audio", "parakeet",
    "dots3note_a", "qwen3tts_spkenc", "qwen3tts_gen", "pockettts_spkenc", "pockettts_gen",
})  # fmt: skip
# The tensor whose width is what the projector hands the language model, and which of its
# dimensions (ggml order) that is, as clip.cpp's clip_n_mmproj_embd reads it. Only the types
# whose tensor is named plainly; for the rest, projection_dim alone is checked.
OUTPUT_TENSORS: dict[str, tuple[str, int]] = {
    "mlp": ("mm.2.weight", 1),
    "idefics3": ("mm.model.fc.weight", 1),
    "gemma3": ("mm.input_projection.weight", 0),
    "gemma4v": ("mm.input_projection.weight", 1),
}
# (least, most) of each size: beyond the largest real encoders (Gemma 3's 896 px images,
# Pixtral's 1024; a ViT-g's 40 blocks of width 1408) with room to spare.
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    "clip.vision.image_size": (16, 4096),
    "clip.vision.patch_size": (1, 64),
    "clip.vision.block_count": (1, 128),
    "clip.vision.embedding_length": (8, 16384),
    "clip.vision.feed_forward_length": (8, 65536),
    "clip.vision.attention.head_count": (1, 256),
}
MAX_IMAGE_PIXELS = 4096 * 4096  # clip.vision.image_max_pixels, for dynamic-resolution encoders


class ProjectorError(GGUFError):
    """The file is not a vision projector this appliance can load for this model."""

    plain = "this file is not a vision projector the appliance can use with this model"


@dataclass(frozen=True, slots=True)
class ProjectorInfo:
    """What a validated projector's header says, for the catalog and the memory estimate."""

    projector_type: str
    projection_dim: int
    image_size: int
    patch_size: int
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    max_pixels: int  # the most pixels one image is encoded at
    weights_bytes: int
    file_size: int

    @property
    def image_tokens(self) -> int:
        """Patches of the largest image the encoder takes (before any merging it does)."""
        return self.max_pixels // (self.patch_size * self.patch_size)

    @property
    def encoder_compute_bytes(self) -> int:
        """An upper bound on the encoder's compute buffer, reckoned from its sizes: ggml keeps
        the f32 activations of one image alive at once, so with n = image tokens + the class
        token, d its width, f its FFN width and h its heads, the largest set is about the
        attention scores (h x n x n), a few n x d tensors (the residual, Q, K, V, the
        attention's output, a norm: 6) and the FFN's two n x f; plus the image itself in f32
        (3 x pixels) and the projected output (n x projection_dim). Flash attention and
        merging encoders need less; that only over-estimates."""
        n = self.image_tokens + 1
        elements = (self.head_count * n * n + n * (6 * self.embedding_length
                    + 2 * self.feed_forward_length + self.projection_dim)
                    + 3 * self.max_pixels)  # fmt: skip
        return 4 * elements


def projector_type(info: GGUFInfo) -> str:
    """The projector type as libmtmd reads it: clip.projector_type, else the vision one of a
    file with several modalities."""
    for key in ("clip.projector_type", "clip.vision.projector_type"):
        value = info.metadata.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def is_projector(info: GGUFInfo) -> bool:
    """Whether the file is a CLIP projector rather than a language model (the models-directory
    scan and a create's files tell the two apart by it)."""
    return info.architecture == CLIP_ARCHITECTURE


def check_projector(info: GGUFInfo, n_embd: int | None) -> ProjectorInfo:
    """The projector's header checked (the module's steps) for a language model of width
    `n_embd` (None: the width is not checked, for a file not yet paired). Raises
    ProjectorError naming what is wrong."""
    # 1. A CLIP file with a vision encoder.
    if not is_projector(info):
        raise ProjectorError(
            f"its general.architecture is {info.architecture or 'missing'!r}, not 'clip': it "
            "is not a projector (mmproj) file"
        )
    if info.metadata.get("clip.has_vision_encoder") is not True:
        raise ProjectorError("it has no vision encoder (clip.has_vision_encoder is not true)")
    # 2. A type this llama.cpp encodes images with.
    kind = projector_type(info)
    if not kind:
        raise ProjectorError("it does not say its projector type (clip.projector_type)")
    if kind in AUDIO_PROJECTORS:
        raise ProjectorError(f"its projector type {kind!r} encodes audio, not images")
    if kind not in VISION_PROJECTORS:
        raise ProjectorError(f"its projector type {kind!r} is not one this llama.cpp knows")
    # 4. Bounded sizes (before they are used to reckon anything).
    sizes = {key: _bounded(info, key, lo, hi) for key, (lo, hi) in SIZE_BOUNDS.items()}
    image_size = sizes["clip.vision.image_size"]
    patch_size = sizes["clip.vision.patch_size"]
    if patch_size > image_size:
        raise ProjectorError(f"its patch size {patch_size} is larger than its image size "
                             f"{image_size}")  # fmt: skip
    max_pixels = image_size * image_size
    if "clip.vision.image_max_pixels" in info.metadata:
        max_pixels = max(max_pixels, _bounded(info, "clip.vision.image_max_pixels", 1,
                                              MAX_IMAGE_PIXELS))  # fmt: skip
    # 3. Its output as wide as the model's input.
    projection_dim = _bounded(info, "clip.vision.projection_dim", 1, 1 << 16)
    if n_embd is not None and projection_dim != n_embd:
        raise ProjectorError(
            f"its projection width (clip.vision.projection_dim) is {projection_dim}, but the "
            f"language model's embedding width is {n_embd}: it was made for another model"
        )
    output = OUTPUT_TENSORS.get(kind)
    tensor = next((t for t in info.tensors if output and t.name == output[0]), None)
    if n_embd is not None and tensor is not None and len(tensor.shape) > output[1]:
        width = tensor.shape[output[1]]
        if width != n_embd:
            raise ProjectorError(
                f"its last projector tensor {tensor.name} puts out {width} values per image "
                f"token, but the language model's embedding width is {n_embd}"
            )
    return ProjectorInfo(
        projector_type=kind, projection_dim=projection_dim, image_size=image_size,
        patch_size=patch_size, block_count=sizes["clip.vision.block_count"],
        embedding_length=sizes["clip.vision.embedding_length"],
        feed_forward_length=sizes["clip.vision.feed_forward_length"],
        head_count=sizes["clip.vision.attention.head_count"], max_pixels=max_pixels,
        weights_bytes=info.weights_bytes, file_size=info.file_size,
    )  # fmt: skip


def _bounded(info: GGUFInfo, key: str, lo: int, hi: int) -> int:
    value = info.metadata.get(key)
    if value is None:
        raise ProjectorError(f"it does not state {key}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProjectorError(f"its {key} is not a whole number: {value!r}")
    if not lo <= value <= hi:
        raise ProjectorError(f"its {key} {value} is outside {lo}..{hi}")
    return value
