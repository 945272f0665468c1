"""The runner: the only module that calls llama.cpp.

One llama.cpp context holds several sequences, each in its own KV stream. `execute()` builds one
`llama_batch` from the scheduler's chunks (several sequence ids, logits only where a token is
sampled), calls `llama_decode`, and samples each sequence with its own sampler chain. It decides
no policy: what runs is the scheduler's business.
"""

import ctypes
import logging
import os
import secrets
import threading

import llama_cpp as ll

from inference.engine.params import SamplingParams
from inference.engine.prefix_cache import KvTrim
from inference.engine.request import Request
from inference.engine.runner_config import KV_TYPES, RunnerConfig
from inference.engine.scheduler import Chunk

_backend_lock = threading.Lock()
_backend_ready = False
log = logging.getLogger("llama.cpp")

# ggml's levels in this llama.cpp: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. It prints
# thousands of lines per model load; only warnings and errors reach Python logging.
_LEVELS = {3: logging.WARNING, 4: logging.ERROR}


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level in _LEVELS:
        log.log(_LEVELS[level], "%s", text.decode("utf-8", errors="replace").rstrip())

DECODE_ERRORS = {
    1: "no room in the KV cache for this batch",
    2: "the computation was aborted",
    -1: "llama.cpp rejected the batch as invalid",
}


class LoadError(RuntimeError):
    """llama.cpp could not load the model or create its context."""


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _backend_ready = True


class LlamaRunner:
    def __init__(self, config: RunnerConfig):
        _init_backend()
        self.config = config
        if not os.path.isfile(config.model_path):
            raise LoadError(f"model file not found: {config.model_path}")
        model_params = ll.llama_model_default_params()
        model_params.n_gpu_layers = 999 if config.n_gpu_layers < 0 else config.n_gpu_layers
        model_params.use_extra_bufts = config.use_extra_bufts
        self.model = ll.llama_model_load_from_file(config.model_path.encode(), model_params)
        if not self.model:
            raise LoadError(f"llama.cpp could not load {config.model_path}")
        self.vocab = ll.llama_model_get_vocab(self.model)

        threads = config.n_threads or os.cpu_count() or 1
        self.n_slots = config.parallel + config.cache_slots
        ctx_params = ll.llama_context_default_params()
        ctx_params.n_ctx = config.ctx_per_seq * self.n_slots
        ctx_params.n_batch = config.n_batch
        ctx_params.n_ubatch = min(config.n_ubatch, config.n_batch)
        ctx_params.n_seq_max = self.n_slots
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        # One KV stream per sequence, not a unified buffer: a sequence's cells then never mix
        # with (or fill the holes of) other sequences', so its arithmetic, and its greedy
        # output, is the same alone or batched; llama.cpp also decodes unrelated sequences
        # faster this way. The cost is a fixed ctx_per_seq cells per slot.
        ctx_params.kv_unified = False
        ctx_params.type_k = ctx_params.type_v = KV_TYPES[config.kv_type]
        ctx_params.flash_attn_type = (
            ll.LLAMA_FLASH_ATTN_TYPE_AUTO if config.flash_attn
            else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )  # fmt: skip
        ctx_params.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise LoadError("llama.cpp could not create a context with these settings")
        self.memory = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.ctx_per_seq = min(config.ctx_per_seq, self.n_ctx)
        self.n_batch = config.n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.threads = threads
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._samplers: dict[str, ll.llama_sampler_p] = {}
        self._pieces: dict[int, bytes] = {}
        self._closed = False
        self._info = self._read_info()

    # --- text --------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        capacity = len(data) + 16
        while True:
            buffer = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, True)
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        cached = self._pieces.get(token)
        if cached is None:
            buffer = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buffer, 64, 0, False)
            if n < 0:
                buffer = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buffer, -n, 0, False)
            cached = self._pieces[token] = buffer.raw[:n]
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    # --- samplers ----------------------------------------------------------------------------

    def prepare(self, request: Request) -> None:
        self._samplers[request.id] = self._sampler_chain(request.params, request.prompt_ids)

    def release(self, request: Request) -> None:
        sampler = self._samplers.pop(request.id, None)
        if sampler is not None:
            ll.llama_sampler_free(sampler)

    def _sampler_chain(self, p: SamplingParams, prompt_ids: list[int]):
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        if p.uses_penalties:
            # This llama.cpp takes n_vocab first, and reads a negative window as 0 (penalties
            # off): the whole context is asked for by its size.
            last_n = self.ctx_per_seq if p.repeat_last_n < 0 else p.repeat_last_n
            penalties = ll.llama_sampler_init_penalties(
                self.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
            add(chain, penalties)
        if p.greedy:
            add(chain, ll.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(chain, ll.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
            add(chain, ll.llama_sampler_init_temp(p.temperature))
            seed = p.seed if p.seed is not None else secrets.randbits(32)
            add(chain, ll.llama_sampler_init_dist(seed))
        if p.uses_penalties:  # penalties look back over the prompt too, as llama.cpp's tools do
            window = len(prompt_ids) if p.repeat_last_n < 0 else p.repeat_last_n
            for token in prompt_ids[-window:] if window else []:
                ll.llama_sampler_accept(chain, token)
        return chain

    # --- the KV cache and the step -----------------------------------------------------------

    def trim(self, trims: list[KvTrim]) -> None:
        for trim in trims:
            ll.llama_memory_seq_rm(self.memory, trim.seq_id, trim.start, -1)

    def execute(self, chunks: list[Chunk]) -> list[int]:
        batch = self._batch
        token, pos, n_seq, seq, logits = (
            batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits)  # fmt: skip
        total = sum(len(chunk.tokens) for chunk in chunks)
        if total > self.n_batch:  # checked before writing: the batch holds n_batch tokens
            raise ValueError(f"a step of {total} tokens exceeds n_batch {self.n_batch}")
        i = 0
        wanted: list[tuple[str, int]] = []
        for chunk in chunks:
            seq_id = chunk.request.seq_id
            position = chunk.start
            for tok in chunk.tokens:
                token[i] = tok
                pos[i] = position
                n_seq[i] = 1
                seq[i][0] = seq_id
                logits[i] = 0
                position += 1
                i += 1
            if chunk.sample:
                logits[i - 1] = 1
                wanted.append((chunk.request.id, i - 1))
        batch.n_tokens = i
        rc = ll.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))
        sample = ll.llama_sampler_sample
        return [sample(self._samplers[rid], self.ctx, index) for rid, index in wanted]

    def warm_up(self) -> None:
        """Decode a few tokens on sequence 0 and forget them: the first matmuls run at load, so
        a CPU that cannot run this build's kernels fails here, not in someone's answer."""
        text = "Hello, this is a warm-up of the model's kernels before anyone is served."
        ids = self.tokenize(text)[: min(16, self.n_batch - 1, self.ctx_per_seq - 2)]
        batch = self._batch
        for n, start in ((len(ids), 0), (1, len(ids))):  # a prompt-sized batch, then one token
            for i in range(n):
                batch.token[i] = ids[(start + i) % len(ids)]
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == n - 1
            batch.n_tokens = n
            rc = ll.llama_decode(self.ctx, batch)
            if rc != 0:
                raise LoadError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))
        ll.llama_memory_seq_rm(self.memory, 0, 0, -1)

    # --- facts -------------------------------------------------------------------------------

    def info(self) -> dict:
        """Facts about the loaded model; read once at load, so telemetry snapshots (several a
        second) cost no llama.cpp calls and stay readable after close()."""
        return dict(self._info)

    def _read_info(self) -> dict:
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        return {
            "path": self.config.model_path,
            "description": desc.value.decode(errors="replace"),
            "size_bytes": int(ll.llama_model_size(self.model)),
            "n_params": int(ll.llama_model_n_params(self.model)),
            "n_ctx_train": int(ll.llama_model_n_ctx_train(self.model)),
            "n_ctx": self.n_ctx,
            "ctx_per_seq": self.ctx_per_seq,
            "n_slots": self.n_slots,
            "n_batch": self.n_batch,
            "threads": self.threads,
            "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sampler in self._samplers.values():
            ll.llama_sampler_free(sampler)
        self._samplers.clear()
        ll.llama_batch_free(self._batch)
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)
