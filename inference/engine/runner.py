"""The runner: the only module that calls llama.cpp.

One llama.cpp context holds several sequences, each in its own KV stream. `execute()` builds one
`llama_batch` from the scheduler's chunks (several sequence ids, logits only where a token is
sampled), calls `llama_decode`, and samples each sequence with its own sampler chain. It decides
no policy: what runs is the scheduler's business.
"""

import ctypes
import logging
import math
import os
import re
import secrets
import threading
import time

import llama_cpp as ll
import numpy as np

from inference.engine.buffers import gpu_split, read_load_log
from inference.engine.draft_model import DraftModel, DraftModelError
from inference.engine.embedding import pack
from inference.engine.events import StepLogprobs, TokenLogprob
from inference.engine.params import InvalidParams, SamplingParams
from inference.engine.picture_decoder import PictureDecoder
from inference.engine.prefix_cache import KvTrim
from inference.engine.projector import Projector, ProjectorError, route_logs
from inference.engine.request import Request
from inference.engine.reranking import RANK_POOLING, PairLayout
from inference.engine.runner_config import KV_TYPES, RunnerConfig
from inference.engine.scheduler import Chunk
from inference.engine.vision import (
    ImageSpan,
    MediaPrompt,
    first_position,
    is_media,
    kv_position,
)

_backend_lock = threading.Lock()
_backend_ready = False
log = logging.getLogger("llama.cpp")

# ggml's levels in this llama.cpp: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. It prints
# thousands of lines per model load; only warnings and errors reach Python logging.
_LEVELS = {3: logging.WARNING, 4: logging.ERROR}


# A thread collecting llama.cpp's complaints (a grammar that does not parse) instead of logging
# them: a client's bad grammar is that client's 400, not an appliance error.
_capture = threading.local()
# A thread loading a model keeps llama.cpp's INFO lines of that load: the only place it says
# what it allocated on which device (inference.engine.buffers).
_loading = threading.local()


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    loading = getattr(_loading, "lines", None)
    if loading is not None and level == 2:
        loading.append(text.decode("utf-8", errors="replace"))
    lines = getattr(_capture, "lines", None)
    if lines is not None and level in (4, 5):
        lines.append(text.decode("utf-8", errors="replace"))
    elif level in _LEVELS:
        log.log(_LEVELS[level], "%s", text.decode("utf-8", errors="replace").rstrip())

DECODE_ERRORS = {
    1: "no room in the KV cache for this batch",
    2: "the computation was aborted",
    -1: "llama.cpp rejected the batch as invalid",
}


EMBED_MAX_TOKENS = 2048  # per input (see embed_limit)
CALIBRATE_S = 0.1  # at most about this long timing steps by size at load (calibrate)
# Inputs per llama_decode of the embedding context. Measured on the starter model (CPU): with
# several inputs in one decode, an input's vector moved by up to 0.4 % (0.15 in a component of a
# vector of length 37) against the same input alone, once a decode held more than ~32 tokens:
# ggml picks its kernels (flash attention's tiled path, matmul tiles by row) by the size and
# layout of the ubatch. A text must give the same vector whatever it is sent with, so each
# input is its own decode; the test that compares alone and batched guards a larger value.
EMBED_MAX_SEQS = 1
# llama.cpp's pooling types (llama_pooling_type); a GGUF names its own under <arch>.pooling_type.
_POOL_NONE, _POOL_MEAN = 0, 1


class LoadError(RuntimeError):
    """llama.cpp could not load the model or create its context."""


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _backend_ready = True


def _grammar_complaint(grammar: str, lines: list[str]) -> str:
    """Why llama.cpp refused a grammar, as far as it says through its log (the parser's own
    detail goes to stderr, not to the log callback)."""
    text = " ".join(" ".join(lines).split())[:300] or "it does not parse"
    if not re.search(r"^\s*root\s*::=", grammar, re.MULTILINE):
        text += " (it defines no root rule)"
    return text + "; see llama.cpp's grammars/README.md for GBNF"


class LlamaRunner:
    def __init__(self, config: RunnerConfig, *, pictures: PictureDecoder | None = None):
        """`pictures`: the process a vision model's pictures are decoded in (its own, by
        default: inference.engine.picture_decoder)."""
        _init_backend()
        self.config = config
        if not os.path.isfile(config.model_path):
            raise LoadError(f"model file not found: {config.model_path}")
        model_params = ll.llama_model_default_params()
        model_params.n_gpu_layers = 999 if config.n_gpu_layers < 0 else config.n_gpu_layers
        model_params.use_extra_bufts = config.use_extra_bufts
        _loading.lines = []
        try:
            self._load_model_and_context(config, model_params)
            self._allocated = read_load_log(_loading.lines)
        finally:
            _loading.lines = None
        self.memory = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.ctx_per_seq = min(config.ctx_per_seq, self.n_ctx)
        self.n_batch = config.n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self._eog_tokens: list[int] | None = None  # found when a request first ignores them
        self.n_swa = int(ll.llama_model_n_swa(self.model))  # 0: no sliding-window layers
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self._samplers: dict[str, ll.llama_sampler_p] = {}
        self._sampled: dict[str, list[int]] = {}  # the last step's sampled rows, by request id
        self._pieces: dict[int, bytes] = {}
        self._special_pieces: dict[int, bytes] = {}
        self._closed = False
        self._draft = self._load_draft_model(config)
        self._projector = None
        self._embd_batch = None
        self._mrope_pos = None  # the embedding batch's positions with M-RoPE (_load_projector)
        self._embd_pos: int | None = None  # the address of the batch's own pos array
        # The images of what each sequence holds (hold): its KV positions with M-RoPE.
        self._layouts: dict[int, list[ImageSpan] | None] = {}
        self._saved_logits: dict[str, dict[int, np.ndarray]] = {}
        try:
            self._projector = self._load_projector(config, pictures)
        except LoadError:
            self._free_model()
            raise
        self._info = self._read_info()
        # Embeddings run on a second context of the same weights, made on first use (most
        # models never embed). One input is pooled within one ubatch, so the ubatch is the
        # most tokens an input may have; for a generative model llama.cpp also computes logits
        # for every one of them (the starter model: 401 MiB of compute buffer at 2048 tokens),
        # hence the cap.
        self.embed_limit = min(self.ctx_per_seq, self._info["n_ctx_train"] or self.ctx_per_seq,
                               EMBED_MAX_TOKENS)  # fmt: skip
        self._embed_ctx = None
        self._embed_batch = None
        # A reranker (inference.engine.reranking) pools one score per pair and does nothing else.
        self.pooling = self._named_pooling()
        self.ranks = self.pooling == RANK_POOLING
        self.pair_layout = self._pair_layout() if self.ranks else None

    def _load_model_and_context(self, config: RunnerConfig, model_params) -> None:
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
        self.threads = threads
        self._step_threads = threads  # what llama_decode uses now (share_cores)

    def _load_draft_model(self, config: RunnerConfig) -> DraftModel | None:
        """The model's draft model, if it has one that can draft for it. One that cannot (its
        vocabulary differs, its file is gone) leaves the model serving without it, and says
        why in info() (the model page shows it): the household keeps its model either way."""
        self.draft_problem = None
        if not config.draft_model_path:
            return None
        try:
            return DraftModel(config.draft_model_path, self.vocab, sequences=self.n_slots,
                              n_threads=self.threads, n_gpu_layers=config.n_gpu_layers,
                              kv_type=config.kv_type, flash_attn=config.flash_attn,
                              use_extra_bufts=config.use_extra_bufts)  # fmt: skip
        except DraftModelError as exc:
            log.warning("%s: %s", config.model_path, exc)
            self.draft_problem = str(exc)
            return None

    def _load_projector(self, config: RunnerConfig,
                        pictures: PictureDecoder | None) -> Projector | None:  # fmt: skip
        """The vision projector, with libmtmd: a projector that does not load is the load's
        failure (the model was asked for with it), said clearly. Its encoder gets threads of its
        own, few on a small box: it runs beside the steps (inference.engine.vision), and the
        streams' decodes come first. (libmtmd's CLIP graph takes no extra buffer types, so the
        host's verdict on them has nothing to turn off there.)"""
        if not config.mmproj_path:
            return None
        cores = os.cpu_count() or 1
        threads = 1 if cores <= 4 else max(1, min(self.threads, cores) // 4)
        use_gpu = config.n_gpu_layers != 0 and bool(ll.llama_supports_gpu_offload())
        n_embd = int(ll.llama_model_n_embd_inp(self.model))
        route_logs(_log_callback)
        try:
            projector = Projector(config.mmproj_path, self.model, n_threads=threads,
                                  use_gpu=use_gpu, flash_attn=config.flash_attn, n_embd=n_embd,
                                  max_whole=min(config.n_ubatch, config.n_batch),
                                  sha256=config.mmproj_sha256, pictures=pictures)  # fmt: skip
        except ProjectorError as exc:
            raise LoadError(str(exc)) from exc
        self._embd_batch = ll.llama_batch_init(self.n_batch, n_embd, 1)
        if projector.mrope:
            # Four positions a row (llama.cpp's M-RoPE sections, section-major) where
            # llama_batch_init made room for one: the batch reads them from an array of ours.
            # (Its own array's address is kept as a number: a pointer read from the struct is
            # a view of the field, and would follow it to ours.)
            self._mrope_pos = (ll.llama_pos * (4 * self.n_batch))()
            self._embd_pos = ctypes.cast(self._embd_batch.pos, ctypes.c_void_p).value
            self._embd_batch.pos = ctypes.cast(self._mrope_pos, ctypes.POINTER(ll.llama_pos))
        return projector

    def _free_model(self) -> None:
        if self._draft is not None:
            self._draft.close()
        ll.llama_batch_free(self._batch)
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)
        self._closed = True

    # --- images (on the engine's encoder thread) ------------------------------------------

    @property
    def takes_images(self) -> bool:
        """A projector is loaded: requests may carry images (whose reading may still be
        refused, with image_problem's reason)."""
        return self._projector is not None

    @property
    def image_width(self) -> int | None:
        """The width of an image's embeddings (the model's input width); None without a
        projector."""
        return self._projector.n_embd if self._projector is not None else None

    @property
    def image_problem(self) -> str | None:
        return self._projector.problem if self._projector is not None else None

    def share_cores(self, encoding: bool) -> None:
        """Leave the encoder its cores while it encodes: the steps run on the rest, then on all
        of them again. Measured on 2 cores (the starter, a ViT-B-sized projector, 3 cameras
        beside a person's stream): with both decode threads sharing a core with the encoder,
        a preempted thread held every barrier of llama.cpp's graph and one-token steps took up
        to 5.9 s (ITL p99 4.2 s); with the steps on the other core, ITL p99 133 ms, max 141 ms.
        A projector on a GPU takes no CPU cores from the steps."""
        projector = self._projector
        if projector is None or projector.use_gpu:
            return
        wanted = max(1, self.threads - projector.n_threads) if encoding else self.threads
        if wanted != self._step_threads:
            ll.llama_set_n_threads(self.ctx, wanted, wanted)
            self._step_threads = wanted

    def read_images(self, prompt: str, images: tuple, add_special: bool) -> MediaPrompt:
        """Decode the pictures and read the prompt into text tokens and image spans
        (vision.MediaPrompt); a picture that cannot be decoded is a Refused (invalid)."""
        return self._projector.read(prompt, images, add_special)

    def encode_image(self, prompt: MediaPrompt, index: int) -> np.ndarray:
        return self._projector.encode(prompt, index)

    def free_media(self, prompt: MediaPrompt) -> None:
        self._projector.free(prompt)

    # --- text --------------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        capacity = len(data) + 16
        while True:
            buffer = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special,
                                  parse_special)  # fmt: skip
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        return self._piece(token, self._pieces, special=False)

    def special_piece(self, token: int) -> bytes:
        """The token's bytes with a special token written out ("<|im_start|>"), as /detokenize
        and logprobs show it; piece() leaves special tokens out of answers."""
        return self._piece(token, self._special_pieces, special=True)

    def _piece(self, token: int, cache: dict[int, bytes], *, special: bool) -> bytes:
        cached = cache.get(token)
        if cached is None:
            buffer = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
            if n < 0:
                buffer = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buffer, -n, 0, special)
            cached = cache[token] = buffer.raw[:n]
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    # --- samplers ----------------------------------------------------------------------------

    def validate(self, params: SamplingParams) -> None:
        """Refuse (InvalidParams) what only llama.cpp can judge: a grammar it cannot parse.
        Called at submit, on the submitting thread; parsing reads only the vocabulary."""
        sampler = self._grammar_sampler(params) if params.grammar is not None else None
        if sampler is not None:
            ll.llama_sampler_free(sampler)
        beyond = [token for token, _ in params.logit_bias if token >= self.n_vocab]
        if beyond:
            raise InvalidParams("logit_bias", f"token id {beyond[0]} is not in this model's "
                                f"vocabulary of {self.n_vocab} tokens")  # fmt: skip

    def prepare(self, request: Request) -> None:
        self._samplers[request.id] = self._sampler_chain(request.params, request.prompt_ids)

    def release(self, request: Request) -> None:
        sampler = self._samplers.pop(request.id, None)
        if sampler is not None:
            ll.llama_sampler_free(sampler)

    def _trigger_tokens(self, words: tuple[str, ...]) -> list[int]:
        """The trigger words that are one token each here (see SamplingParams.grammar)."""
        tokens = [self.tokenize(word, add_special=False) for word in words]
        return [ids[0] for ids in tokens if len(ids) == 1]

    def _grammar_sampler(self, p: SamplingParams):
        """The request's own grammar sampler (its parse state is per sequence), or None for a
        lazy grammar without a usable trigger; InvalidParams when the grammar does not parse."""
        grammar = p.grammar.encode()
        triggers = self._trigger_tokens(p.grammar_triggers) if p.grammar_triggers else []
        if p.grammar_triggers and not triggers:
            return None
        _capture.lines = []
        try:
            if triggers:
                tokens = (ll.llama_token * len(triggers))(*triggers)
                sampler = ll.llama_sampler_init_grammar_lazy_patterns(
                    self.vocab, grammar, b"root", None, 0, tokens, len(triggers)
                )
            else:
                sampler = ll.llama_sampler_init_grammar(self.vocab, grammar, b"root")
            complaints = _capture.lines
        finally:
            _capture.lines = None
        if not sampler:
            raise InvalidParams("grammar", "llama.cpp cannot use this grammar: "
                                + _grammar_complaint(p.grammar, complaints))  # fmt: skip
        return sampler

    def _biases(self, p: SamplingParams) -> list[tuple[int, float]]:
        """The request's logit biases, and with ignore_eos every end-of-generation token's -inf
        (llama-server's way: the vocabulary's EOG tokens, found once)."""
        biases = list(p.logit_bias)
        if p.ignore_eos:
            if self._eog_tokens is None:
                self._eog_tokens = [t for t in range(self.n_vocab) if self.is_eog(t)]
            biases += [(token, -math.inf) for token in self._eog_tokens]
        return biases

    def _sampler_chain(self, p: SamplingParams, prompt_ids: list[int]):
        # The grammar first: it masks what it forbids, and everything after it (penalties,
        # top-k, ..., the draw) only ever sees tokens the grammar allows.
        grammar = self._grammar_sampler(p) if p.grammar is not None else None
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        if grammar is not None:
            add(chain, grammar)
        biases = self._biases(p)
        if biases:  # before the rest, as llama.cpp's common sampler puts it
            pairs = (ll.llama_logit_bias * len(biases))(*(ll.llama_logit_bias(token, bias)
                                                           for token, bias in biases))  # fmt: skip
            add(chain, ll.llama_sampler_init_logit_bias(self.n_vocab, len(biases), pairs))
        penalties = None
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
            if p.typical_p < 1.0:
                add(chain, ll.llama_sampler_init_typical(p.typical_p, 1))
            if p.top_p < 1.0:
                add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
            add(chain, ll.llama_sampler_init_temp(p.temperature))
            seed = p.seed if p.seed is not None else secrets.randbits(32)
            add(chain, ll.llama_sampler_init_dist(seed))
        if penalties is not None:  # they look back over the prompt too, as llama.cpp's tools do
            window = len(prompt_ids) if p.repeat_last_n < 0 else p.repeat_last_n
            for token in prompt_ids[-window:] if window else []:
                # Into the penalties alone: the grammar constrains the answer, not the prompt.
                # An image's positions hold no token (vision.is_media): nothing to penalise.
                if not is_media(token):
                    ll.llama_sampler_accept(penalties, token)
        return chain

    # --- the KV cache and the step -----------------------------------------------------------

    @property
    def positions_are_indexes(self) -> bool:
        """Whether a token's KV position is its index in its sequence: everywhere but where an
        M-RoPE projector gives an image fewer positions than tokens (vision.kv_position)."""
        return self._mrope_pos is None

    def hold(self, seq_id: int, spans: list[ImageSpan] | None) -> None:
        """Sequence `seq_id` now holds (a prefix of) a prompt with these images (None: none):
        its KV positions from here on, for the trims and checks that speak of token indexes.
        A slot taken by a new request shares the prefix it keeps with what it held before, so
        the new request's images place that prefix as the old ones did."""
        if not self.positions_are_indexes:
            self._layouts[seq_id] = spans

    def _position(self, seq_id: int, index: int) -> int:
        if self.positions_are_indexes or index == 0:
            return index
        return kv_position(self._layouts.get(seq_id), index)

    def trim(self, trims: list[KvTrim]) -> None:
        for trim in trims:
            start = self._position(trim.seq_id, trim.start)
            ll.llama_memory_seq_rm(self.memory, trim.seq_id, start, -1)

    def continues(self, seq_id: int, position: int) -> bool:
        """Whether sequence `seq_id` can go on at `position` with the KV it holds: its cells end
        right before it (a recurrent model's state cannot be trimmed back to a prefix), and a
        model with sliding-window layers still has the window before it (those layers drop
        older cells as they go, so an old prefix may be gone there; llama-server checks the
        same, pos_min against n_swa)."""
        if position == 0:
            return True
        last = self._position(seq_id, position - 1)  # an M-RoPE image's rows share one
        if ll.llama_memory_seq_pos_max(self.memory, seq_id) != last:
            return False
        if self.n_swa <= 0:
            return True
        pos_min = ll.llama_memory_seq_pos_min(self.memory, seq_id)
        return pos_min == 0 or pos_min < max(0, last + 1 - self.n_swa)

    @property
    def state_format(self) -> str:
        """What a saved sequence state's layout depends on besides the model and settings."""
        return f"llama-cpp-python {ll.__version__}, state {ll.LLAMA_STATE_SEQ_VERSION}"

    def state_size(self, seq_id: int) -> int:
        """The bytes `save(seq_id)` will copy (counted, not copied): the RAM tier takes room for
        them before the copy is made."""
        return ll.llama_state_seq_get_size(self.ctx, seq_id)

    def save(self, seq_id: int) -> bytearray:
        """The KV state of one sequence (llama_state_seq_get_data): about as many bytes as its
        cells hold (23 KB a token for the starter model), copied in ~1 ms per 10 MB here."""
        size = ll.llama_state_seq_get_size(self.ctx, seq_id)
        data = bytearray(size)
        written = ll.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq_id
        )
        if written != size:
            raise RuntimeError(f"llama.cpp wrote {written} of {size} bytes of sequence {seq_id}")
        return data

    def restore(self, seq_id: int, data: bytearray) -> bool:
        """A saved state into sequence `seq_id`, emptied first; False (and the sequence empty)
        when llama.cpp refuses it. Only states this runner's layout saved reach here (the
        tiers check model, settings and checksums first)."""
        ll.llama_memory_seq_rm(self.memory, seq_id, 0, -1)
        if not data:
            return False
        read = ll.llama_state_seq_set_data(
            self.ctx, (ctypes.c_uint8 * len(data)).from_buffer(data), len(data), seq_id
        )
        if read != len(data):
            ll.llama_memory_seq_rm(self.memory, seq_id, 0, -1)
            return False
        return True

    def execute(self, chunks: list[Chunk]) -> list[list[int]]:
        """Run one step; for each chunk that samples, in the plan's order, the tokens sampled:
        one, or for a chunk with a draft (speculation), the model's own tokens at each drafted
        position as long as they agree with the draft, then the one where they first differ
        (or, all kept, the one after the last): each from its position's logits through the
        request's sampler chain, which accepts only the tokens kept (a grammar advances
        through those alone). The KV then holds every drafted token: the engine trims what
        was not kept.

        A chunk of a prompt with images is a run of text and then a run of one image's
        positions (vision.chunk_length): the text goes into the token batch, the image's rows
        into an embedding batch decoded after it (a batch is either tokens or embeddings), so
        the image attends to the text before it as in one batch."""
        batch = self._batch
        token, pos, n_seq, seq, logits = (
            batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits)  # fmt: skip
        text = {n: self._text_part(chunk) for n, chunk in enumerate(chunks)}
        total = sum(text[n] + len(chunk.draft) for n, chunk in enumerate(chunks))
        if total > self.n_batch:  # checked before writing: the batch holds n_batch tokens
            raise ValueError(f"a step of {total} tokens exceeds n_batch {self.n_batch}")
        i = 0
        wanted: dict[int, tuple[str, int, list[int]]] = {}  # chunk -> (id, first row, draft)
        images: list[int] = []  # chunks with image rows
        # Written in sequence-id order: with one KV stream per sequence, llama.cpp splits a
        # batch into ubatches that each take one run of consecutive, increasing sequence ids
        # in batch order (llama_batch_allocr::split_equal), and each ubatch is a graph pass of
        # its own. In the plan's order (admission order, scattered slots) seven decodes took
        # 133 ms on a 2-core CPU, in id order 117 ms.
        order = sorted(range(len(chunks)), key=lambda n: chunks[n].request.seq_id)
        for n in order:
            chunk = chunks[n]
            seq_id = chunk.request.seq_id
            # Text is a run of consecutive positions: from the chunk's start's, which is its
            # index but after an M-RoPE image (vision.kv_position).
            position = (chunk.start if self.positions_are_indexes
                        else kv_position(chunk.request.media, chunk.start))  # fmt: skip
            for tok in (*chunk.tokens[: text[n]], *chunk.draft):
                token[i] = tok
                pos[i] = position
                n_seq[i] = 1
                seq[i][0] = seq_id
                logits[i] = 0
                position += 1
                i += 1
            if text[n] < len(chunk.tokens):
                images.append(n)
            elif chunk.sample:
                first = i - 1 - len(chunk.draft)  # the last token of `tokens`
                for row in range(first, i):
                    logits[row] = 1
                wanted[n] = (chunk.request.id, first, chunk.draft)
        self._sampled = {}
        self._saved_logits = {}
        results: dict[int, list[int]] = {}
        if i:
            batch.n_tokens = i
            rc = ll.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))
            results.update(self._sample(chunks, wanted, keep_logits=bool(images)))
        if images:
            results.update(self._decode_images(chunks, images))
        return [results[n] for n in sorted(results)]  # in the plan's order

    @staticmethod
    def _text_part(chunk: Chunk) -> int:
        """How many of the chunk's tokens are text before its image rows (all, without any)."""
        if chunk.request.media is None:
            return len(chunk.tokens)
        for n, tok in enumerate(chunk.tokens):
            if is_media(tok):
                return n
        return len(chunk.tokens)

    def _sample(self, chunks: list[Chunk], wanted: dict, *, keep_logits: bool = False) -> dict:
        """Each wanted chunk's tokens from the last decode's logits (see execute). With
        `keep_logits`, another decode follows in this step: the rows a request will read its
        logprobs from are copied first."""
        sample = ll.llama_sampler_sample
        results = {}
        for n in sorted(wanted):
            rid, row, draft = wanted[n]
            chain = self._samplers[rid]
            rows, tokens = [], []
            for guess in (*draft, None):
                tokens.append(sample(chain, self.ctx, row))
                rows.append(row)
                if tokens[-1] != guess:
                    break
                row += 1
            self._sampled[rid] = rows
            if keep_logits and chunks[n].request.params.logprobs is not None:
                self._saved_logits[rid] = {
                    r: np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, r),
                                             shape=(self.n_vocab,)).copy()
                    for r in rows
                }  # fmt: skip
            results[n] = tokens
        return results

    def _decode_images(self, chunks: list[Chunk], images: list[int]) -> dict:
        """The image rows of a step's chunks, from their embeddings, after its token batch:
        together in one embedding batch, except an image the projector wants whole (causal
        attention off), which goes alone. Returns the tokens of chunks that end a prompt on an
        image and sample."""
        together = [n for n in images if not self._span_at(chunks[n]).whole]
        groups = [together] if together else []
        groups += [[n] for n in images if self._span_at(chunks[n]).whole]
        results = {}
        for n, group in enumerate(groups):
            whole = len(group) == 1 and self._span_at(chunks[group[0]]).whole
            results.update(self._decode_embeddings(chunks, group, causal=not whole,
                                                   keep_logits=n < len(groups) - 1))
        return results

    @staticmethod
    def _span_at(chunk: Chunk):
        """The image span the chunk's image rows belong to (they end at its end at most)."""
        last = chunk.start + len(chunk.tokens) - 1
        for span in chunk.request.media:
            if span.start <= last < span.end:
                return span
        raise ValueError("a chunk's image rows lie outside its images")

    def _decode_embeddings(self, chunks: list[Chunk], group: list[int], *, causal: bool,
                           keep_logits: bool) -> dict:  # fmt: skip
        batch = self._embd_batch
        if batch is None:
            raise RuntimeError("image rows reached a runner without a projector")
        n_embd = self._projector.n_embd
        rows = sum(len(chunks[n].tokens) - self._text_part(chunks[n]) for n in group)
        limit = self.n_batch if causal else self._projector.max_whole
        if rows > limit:
            raise ValueError(f"{rows} image rows exceed the batch of {limit}")
        base = ctypes.addressof(batch.embd.contents)
        mrope = None
        if not self.positions_are_indexes:  # the rows' four positions, not one index each
            mrope = np.ctypeslib.as_array(self._mrope_pos, shape=(4 * self.n_batch,))
        i = 0
        wanted = {}
        for n in sorted(group, key=lambda n: chunks[n].request.seq_id):
            chunk = chunks[n]
            span = self._span_at(chunk)
            first = chunk.start + self._text_part(chunk)
            last = chunk.start + len(chunk.tokens)
            block = np.ascontiguousarray(span.embeddings[first - span.start : last - span.start],
                                         dtype=np.float32)  # fmt: skip
            if block.shape != (last - first, n_embd):
                raise ValueError("an image's embeddings do not match its span")
            ctypes.memmove(base + i * n_embd * 4, block.ctypes.data, block.nbytes)
            if mrope is not None:  # section-major: section j of row i at j * rows + i
                at = first_position(chunk.request.media, span)
                positions = span.row_positions(at, first - span.start, last - span.start)
                for section in range(4):
                    offset = section * rows + i
                    mrope[offset : offset + last - first] = positions[section]
            for position in range(first, last):
                if mrope is None:
                    batch.pos[i] = position
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = chunk.request.seq_id
                batch.logits[i] = 0
                i += 1
            if chunk.sample:
                batch.logits[i - 1] = 1
                wanted[n] = (chunk.request.id, i - 1, [])
        batch.n_tokens = i
        if not causal:
            ll.llama_set_causal_attn(self.ctx, False)
        try:
            rc = ll.llama_decode(self.ctx, batch)
        finally:
            if not causal:
                ll.llama_set_causal_attn(self.ctx, True)
        if rc != 0:
            raise RuntimeError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))
        return self._sample(chunks, wanted, keep_logits=keep_logits)

    def logprobs(self, request: Request, token: int, index: int = 0) -> StepLogprobs:
        """`token`'s log-probability at the step execute() just ran for `request` (the
        `index`th token it sampled in that step: speculation samples several), and the
        `request.params.logprobs` likeliest tokens there. Only between that execute() and the
        next: it reads the step's logits, which the next llama_decode overwrites; a request
        that asks for none never gets here, so it costs nothing.

        The distribution the sampler chain draws from: the logits divided by the request's
        temperature (1 for greedy), normalised over the whole vocabulary (a log-softmax in
        float64), as Ollama reports it. Penalties, a grammar's mask and the top-k/top-p/min-p
        cuts are left out: they say what may be drawn, not how likely the model found it."""
        row = self._sampled[request.id][index]
        saved = self._saved_logits.get(request.id)  # a later decode of the step overwrote them
        if saved is not None:
            values = saved[row]
        else:
            pointer = ll.llama_get_logits_ith(self.ctx, row)
            if not pointer:
                raise RuntimeError("llama.cpp kept no logits for this step")
            values = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        params = request.params
        scaled = values.astype(np.float64)
        if not params.greedy:
            scaled /= params.temperature
        peak = scaled.max()
        scaled -= peak + np.log(np.exp(scaled - peak).sum())  # now log-probabilities

        def entry(token_id: int) -> TokenLogprob:
            return TokenLogprob(token_id, self.special_piece(token_id), float(scaled[token_id]))

        top: tuple[TokenLogprob, ...] = ()
        if params.logprobs:
            best = np.argpartition(scaled, -params.logprobs)[-params.logprobs:]
            # The likeliest first; equal ones by id, so the order never depends on the partition.
            best = best[np.lexsort((best, -scaled[best]))]
            top = tuple(entry(int(token_id)) for token_id in best)
        return StepLogprobs(entry(token), top)

    @property
    def drafts_from_model(self) -> bool:
        return self._draft is not None

    def propose_drafts(self, wants: list[tuple[int, np.ndarray, int]]) -> list[list[int]]:
        """The draft model's guesses: for each (sequence id, the stream's text, k), up to k
        tokens (speculation's third source of drafts; none without a draft model)."""
        if self._draft is None:
            return [[] for _ in wants]
        return self._draft.propose(wants)

    @property
    def draft_round_s(self) -> float | None:
        """The last propose_drafts' seconds per drafted token past the first (None: none)."""
        return self._draft.round_s if self._draft is not None else None

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
        if self._draft is not None:
            try:
                self._draft.warm_up()
            except RuntimeError as exc:
                raise LoadError(f"the draft model failed its warm-up: {exc}") from exc

    def calibrate(self, budget_s: float = CALIBRATE_S) -> list[tuple[int, float]]:
        """Time steps of 1, 2, 4, ... tokens of one sequence with logits at every position (a
        stream's decode with a draft being verified), on sequence 0 before anyone uses it, for
        at most about `budget_s`; returns (tokens, seconds) for the engine's step costs. Their
        cost by size is what speculation weighs, and is not a line: on a 2-core CPU two tokens
        cost twice one, sixteen 6.6 times (measured with the starter model)."""
        text = "The household server keeps the photos and answers the kitchen tablet. " * 8
        ids = self.tokenize(text)
        depth = min(16, self.ctx_per_seq // 4, len(ids))
        batch = self._batch
        timings: list[tuple[int, float]] = []
        spent, n = 0.0, 1
        try:
            self._fill(ids[:depth], 0, all_logits=False)  # some context to attend to
            last = 0.0
            # Doubling sizes while the next (about twice the last) fits the budget: the small
            # sizes, where the curve bends; larger ones are measured by prompts read later.
            while n + depth < min(self.n_batch, self.ctx_per_seq) and spent + 2 * last < budget_s:
                self._fill([ids[i % len(ids)] for i in range(n)], depth, all_logits=True)
                started = time.perf_counter()
                rc = ll.llama_decode(self.ctx, batch)
                seconds = time.perf_counter() - started
                ll.llama_memory_seq_rm(self.memory, 0, depth, -1)
                if rc != 0:
                    break
                timings.append((n, seconds))
                spent, last = spent + seconds, seconds
                n *= 2
        finally:
            ll.llama_memory_seq_rm(self.memory, 0, 0, -1)
        return timings

    def _fill(self, ids: list[int], start: int, *, all_logits: bool) -> None:
        """Write ids into the batch as sequence 0 at `start` (and decode them when they are a
        context: all_logits False)."""
        batch = self._batch
        for i, tok in enumerate(ids):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == len(ids) - 1
        batch.n_tokens = len(ids)
        if not all_logits:
            rc = ll.llama_decode(self.ctx, batch)
            if rc != 0:
                raise LoadError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))

    # --- embeddings --------------------------------------------------------------------------

    def embed(self, sequences: list[list[int]]) -> list[bytes]:
        """The pooled embedding of each token sequence: n_embd_out float32 in native byte order,
        not normalised. Each fits embed_limit (inference.engine.embedding.prepare sees to it).
        Up to EMBED_MAX_SEQS go into one llama_decode (one: see there), each its own sequence
        id, in a unified KV whose cells are cleared before every decode; on the engine thread
        only."""
        ctx = self._embedding_context()
        memory = ll.llama_get_memory(ctx)  # NULL for encoders without a KV cache (BERT)
        batch = self._embed_batch
        # A reranker's pooled output is its classifier's (n_cls_out floats); the score is the
        # first, as llama-server reads it, and the rest is not always written.
        dim = 1 if self.ranks else ll.llama_model_n_embd_out(self.model)
        vectors: list[bytes] = []
        for group in pack(sequences, self.embed_limit, EMBED_MAX_SEQS):
            i = 0
            for seq_id, index in enumerate(group):
                for position, token in enumerate(sequences[index]):
                    batch.token[i] = token
                    batch.pos[i] = position
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq_id
                    batch.logits[i] = 1  # pooling reads every token's output
                    i += 1
            batch.n_tokens = i
            if memory:
                ll.llama_memory_clear(memory, True)
            rc = ll.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(DECODE_ERRORS.get(rc, f"llama_decode returned {rc}"))
            for seq_id in range(len(group)):
                pooled = ll.llama_get_embeddings_seq(ctx, seq_id)
                if not pooled:
                    raise RuntimeError("llama.cpp gave no pooled embedding")
                vectors.append(ctypes.string_at(pooled, dim * 4))
        if memory:
            ll.llama_memory_clear(memory, True)
        return vectors

    def _embedding_context(self):
        if self._embed_ctx is not None:
            return self._embed_ctx
        params = ll.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.embed_limit
        params.n_seq_max = EMBED_MAX_SEQS
        params.n_threads = params.n_threads_batch = self.threads
        params.embeddings = True
        params.pooling_type = self._pooling_type()
        # One KV buffer for all sequences of a decode: each still attends only to its own
        # cells, and a decode of several short inputs needs no more cells than one long one.
        params.kv_unified = True
        params.type_k = params.type_v = KV_TYPES[self.config.kv_type]
        params.flash_attn_type = (
            ll.LLAMA_FLASH_ATTN_TYPE_AUTO if self.config.flash_attn
            else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )  # fmt: skip
        params.no_perf = True
        ctx = ll.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create an embedding context for this model")
        self._embed_batch = ll.llama_batch_init(self.embed_limit, 0, 1)
        self._embed_ctx = ctx
        return ctx

    def _pooling_type(self) -> int:
        """The GGUF's own pooling (mean, CLS, last, rank); mean where it names none or "none",
        as a generative model's vector must still be one per input."""
        return _POOL_MEAN if self.pooling == _POOL_NONE else self.pooling

    def _named_pooling(self) -> int:
        """The pooling the GGUF names under <arch>.pooling_type; none where it names none."""
        arch = self._meta("general.architecture")
        named = self._meta(f"{arch}.pooling_type") if arch else None
        try:
            return int(named) if named is not None else _POOL_NONE
        except ValueError:
            return _POOL_NONE

    def _pair_layout(self) -> PairLayout:
        """How this reranker joins a query and a document (inference.engine.reranking, rule 2)."""
        template = ll.llama_model_chat_template(self.model, b"rerank")
        vocab = self.vocab
        return PairLayout(
            template=template.decode("utf-8", errors="replace") if template else None,
            bos=int(ll.llama_vocab_bos(vocab)), eos=int(ll.llama_vocab_eos(vocab)),
            sep=int(ll.llama_vocab_sep(vocab)), add_bos=bool(ll.llama_vocab_get_add_bos(vocab)),
            add_eos=bool(ll.llama_vocab_get_add_eos(vocab)),
            add_sep=bool(ll.llama_vocab_get_add_sep(vocab)),
        )  # fmt: skip

    def _meta(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buffer, 256)
        return buffer.value.decode("utf-8", errors="replace") if n >= 0 else None

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
            # This llama.cpp was built with a GPU backend (CUDA) that found a device.
            "gpu_offload": bool(ll.llama_supports_gpu_offload()),
            # What llama.cpp allocated, by part and device, and the layers it put on GPUs
            # (inference.engine.buffers): the memory panel's split of a runner's GPU memory.
            "buffers": self._allocated["buffers"],
            "gpu_buffers": gpu_split(self._allocated["buffers"]),
            "gpu_layers": self._allocated["gpu_layers"],
            "layers": self._allocated["layers"],
            "draft_model": self._draft_info(),
            # The vision projector (inference.engine.vision): None for a text-only model;
            # image_tokens per image where it is fixed (None where it follows the picture).
            "vision": self._projector.info() if self._projector is not None else None,
        }

    def _draft_info(self) -> dict | None:
        if not self.config.draft_model_path:
            return None
        if self._draft is None:
            return {"path": self.config.draft_model_path, "problem": self.draft_problem}
        return {"path": self._draft.path, "description": self._draft.description,
                "size_bytes": self._draft.size_bytes, "problem": None}  # fmt: skip

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sampler in self._samplers.values():
            ll.llama_sampler_free(sampler)
        self._samplers.clear()
        ll.llama_batch_free(self._batch)
        if self._draft is not None:
            self._draft.close()
        if self._projector is not None:
            self._projector.close()
            if self._embd_pos is not None:  # llama_batch_free frees the array it made
                self._embd_batch.pos = ctypes.cast(ctypes.c_void_p(self._embd_pos),
                                                   ctypes.POINTER(ll.llama_pos))  # fmt: skip
            ll.llama_batch_free(self._embd_batch)
        if self._embed_ctx is not None:
            ll.llama_batch_free(self._embed_batch)
            ll.llama_free(self._embed_ctx)
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)
