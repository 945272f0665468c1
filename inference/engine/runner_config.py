"""How to load a model into a runner: validated settings, importable without llama_cpp."""

from dataclasses import dataclass

KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type ids of the KV cache types we offer
AUTOMATIC_CTX = 0  # ctx_per_seq chosen at load from the training context and free memory
DEFAULT_N_BATCH = 512  # with every layer on a GPU the preflight raises it (planning.fitting)
# A draft model's context (inference.engine.draft_model; sized by the preflight too): the most of
# a stream's text it reads at once, and its KV cells per sequence.
DRAFT_CATCH_UP = 256
DRAFT_WINDOW = 1024


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


@dataclass(slots=True, frozen=True)
class RunnerConfig:
    model_path: str
    # The most tokens (prompt + answer) one sequence may hold. 0: automatic, sized by the host's
    # preflight before the load (inference.planning.preflight.fit); a runner never receives 0.
    ctx_per_seq: int = 2048
    parallel: int = 4  # sequences that can run at once with a full context each
    cache_slots: int = 4  # extra sequence ids that keep finished turns for the prefix cache
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_BATCH
    n_threads: int = 0  # 0: all cores
    n_gpu_layers: int = -1  # -1: every layer the GPU build can take; 0: CPU only
    kv_type: str = "f16"
    # On: llama.cpp's "auto" (flash attention wherever the backend has it). Besides speed, it
    # keeps each sequence's attention arithmetic independent of what else is in the batch.
    flash_attn: bool = True
    # Speculative decoding for this model (inference.engine.speculation): "auto" (as far as it
    # pays, measured), "off". The box's SPECULATIVE_DECODING can only turn it down.
    speculative: str = "auto"
    # A draft model for speculation (inference.engine.draft_model): a GGUF with this model's
    # vocabulary, loaded beside it; "" for none.
    draft_model_path: str = ""
    # A vision projector (general.architecture "clip") that libmtmd loads beside the model, so
    # requests may carry images (inference.engine.media); "" for a text-only model.
    mmproj_path: str = ""
    # That projector file's sha256 where the catalog knows it, "" where not: its identity in
    # image keys (inference.engine.projector.projector_key), the same across restarts, moves
    # and the split worker's own copy of the file.
    mmproj_sha256: str = ""
    # llama.cpp's extra weight buffer types (CPU repacking, AMX tiles). Faster for some
    # quantisations, but a CPU may advertise AMX that its hypervisor does not deliver, and then
    # the first matmul dies with SIGSEGV; the runner supervisor turns this off for such a host.
    use_extra_bufts: bool = True

    def __post_init__(self) -> None:
        # A plain str: the catalog hands over a Django TextChoices member, which would drag
        # Django into the runner process when the config is unpickled there.
        object.__setattr__(self, "kv_type", str(self.kv_type))
        checks = {
            "ctx_per_seq": (16, 1 << 20), "parallel": (1, 64), "cache_slots": (0, 64),
            "n_batch": (1, 1 << 16), "n_ubatch": (1, 1 << 16), "n_threads": (0, 512),
            "n_gpu_layers": (-1, 10_000),
        }  # fmt: skip
        for name, (lo, hi) in checks.items():
            value = getattr(self, name)
            if name == "ctx_per_seq" and type(value) is int and value == AUTOMATIC_CTX:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer between {lo} and {hi}, got {value!r}")
        for name in ("draft_model_path", "mmproj_path"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > 4096:
                raise ValueError(f"{name} must be a path")
        digest = self.mmproj_sha256
        if not isinstance(digest, str) or (digest and not _is_sha256(digest)):
            raise ValueError(f"mmproj_sha256 must be a sha256 hex digest or empty, got {digest!r}")
        object.__setattr__(self, "mmproj_sha256", digest.lower())
        if self.speculative not in ("auto", "off"):
            raise ValueError(f"speculative must be auto or off, got {self.speculative!r}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}")
        slots = self.parallel + self.cache_slots
        if slots > 256:
            raise ValueError("parallel + cache_slots must not exceed 256 sequences")
        if self.n_batch < slots + 8:
            # Every decoding sequence needs its token in each step, with room left for prompts.
            raise ValueError(f"n_batch must be at least {slots + 8} for {slots} sequence slots")
