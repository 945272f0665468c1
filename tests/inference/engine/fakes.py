"""A model-free runner that implements engine.Runner, and helpers shared by the engine tests.

Vocabulary: one token per character (its code point), byte tokens for raw bytes (as real
tokenizers' byte fallback, so a character can be split over several tokens), and EOG = 0.

The fake keeps the KV of every sequence (the token ids at positions 0..n-1) and checks what the
engine asks of it, the way llama.cpp would fail: a chunk must start where its sequence's KV ends,
a step may carry at most n_batch tokens, a sequence at most ctx_per_seq and all of them together
at most n_ctx. A broken check is recorded in `violations` (tests assert it stays empty) and raised.

The next token is a deterministic function of the sequence's KV, so a request gets the same output
whatever runs beside it, and a wrong KV (a bad trim, a wrong position) changes the output.
"""

import json
import math
import random
import threading
import time
from collections import defaultdict

import numpy as np

from inference.engine.engine import Engine
from inference.engine.events import StepLogprobs, TokenLogprob
from inference.engine.generation import GenerationRequest
from inference.engine.media import MEDIA_MARKER
from inference.engine.params import InvalidParams, SamplingParams
from inference.engine.prefix_cache import KvTrim
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.request import Request
from inference.engine.scheduler import Chunk
from inference.engine.vision import ImageSpan, MediaPrompt, image_key, media_ids

EOG = 0
BYTE_BASE = 0x110000  # past the last code point: token BYTE_BASE + b is the raw byte b


def byte_token(value: int) -> int:
    return BYTE_BASE + value


def byte_tokens(text: str) -> list[int]:
    """`text` as one token per UTF-8 byte: multi-byte characters split across tokens."""
    return [byte_token(b) for b in text.encode("utf-8")]


def char_tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def next_token(kv: list[int]) -> int:
    """The fake model: a lowercase letter that depends on the whole sequence."""
    h = len(kv) * 7919
    for token in kv[-16:]:
        h = (h * 31 + token) % 1_000_003
    return ord("a") + h % 26


class FakeRunner:
    def __init__(
        self,
        *,
        n_ctx: int = 1024,
        n_slots: int = 4,
        ctx_per_seq: int = 256,
        n_batch: int = 64,
        overhead: float = 0.0,
        per_token: float = 0.0,
    ):
        self.n_ctx = n_ctx
        self.n_slots = n_slots
        self.ctx_per_seq = ctx_per_seq
        self.n_batch = n_batch
        self.n_vocab = BYTE_BASE + 256  # every code point and every byte
        self.overhead = overhead  # seconds each execute() sleeps, plus per_token per token
        self.per_token = per_token
        self.scripts: dict[str, list[int]] = {}  # request id -> its outputs, in order
        self.fail_for: set[str] = set()  # request ids whose step raises, as a decode error would
        self.fail_trim = False  # trim() raises: a bug in the engine's own machinery
        self.refuse_restore = False  # restore() refuses every state, as llama.cpp may
        self.saves: list[int] = []  # seq ids, one per save()
        self.restores: list[tuple[int, int]] = []  # (seq id, tokens restored)
        self.gate: threading.Event | None = None  # when set up, execute() waits for it
        self.logprobs_asked: list[str] = []  # request ids, one per logprobs() call
        self.executing = threading.Event()  # set while execute() runs
        # The fake's draft model: (the stream's text, k) -> its guesses; None: the model has
        # none. `drafts_asked`: (seq id, k) for each stream it was asked to draft for.
        self.draft_model = None
        self.draft_round_s: float | None = None
        self.drafts_asked: list[tuple[int, int]] = []

        self.kv: dict[int, list[int]] = defaultdict(list)
        self.samplers: set[str] = set()
        self.prepared: list[str] = []
        self.released: list[str] = []
        self.trims: list[KvTrim] = []
        self.steps: list[list[tuple[str, int, int, int, bool]]] = []  # (id, seq, start, n, sample)
        self.step_times: list[tuple[float, float]] = []
        self.violations: list[str] = []
        self.closed = False
        self._lock = threading.Lock()

    # --- text ------------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return char_tokens(text)

    def piece(self, token: int) -> bytes:
        if token == EOG:
            return b""
        if token >= BYTE_BASE:
            return bytes([token - BYTE_BASE])
        return chr(token).encode("utf-8")

    def special_piece(self, token: int) -> bytes:
        return self.piece(token)

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return token == EOG

    # --- samplers ----------------------------------------------------------------------------

    def validate(self, params: SamplingParams) -> None:
        if params.grammar is not None:  # its tokens follow the KV, not a grammar
            raise InvalidParams("grammar", "the fake runner samples no grammar")

    def prepare(self, request: Request) -> None:
        with self._lock:
            self.samplers.add(request.id)
            self.prepared.append(request.id)

    def release(self, request: Request) -> None:
        with self._lock:
            self.samplers.discard(request.id)
            self.released.append(request.id)

    # --- KV and the step -----------------------------------------------------------------------

    def trim(self, trims: list[KvTrim]) -> None:
        if self.fail_trim and trims:
            raise RuntimeError("fake trim failure")
        with self._lock:
            for trim in trims:
                self.trims.append(trim)
                del self.kv[trim.seq_id][trim.start :]

    state_format = "fake 1"

    def continues(self, seq_id: int, position: int) -> bool:
        with self._lock:
            return len(self.kv[seq_id]) == position

    def state_size(self, seq_id: int) -> int:
        with self._lock:
            return len(json.dumps({"fake-kv": self.kv[seq_id]}).encode())

    def save(self, seq_id: int) -> bytearray:
        """A sequence's KV as bytes: its token ids, tagged so that a wrong state is refused."""
        with self._lock:
            self.saves.append(seq_id)
            return bytearray(json.dumps({"fake-kv": self.kv[seq_id]}).encode())

    def restore(self, seq_id: int, data: bytearray) -> bool:
        with self._lock:
            self.kv[seq_id] = []
            if self.refuse_restore:
                return False
            try:
                tokens = json.loads(bytes(data))["fake-kv"]
            except (ValueError, KeyError, TypeError):
                return False
            if len(tokens) > self.ctx_per_seq:
                self._violation(f"a restore of {len(tokens)} tokens > {self.ctx_per_seq}")
            self.kv[seq_id] = list(tokens)
            self.restores.append((seq_id, len(tokens)))
            return True

    def execute(self, chunks: list[Chunk]) -> list[list[int]]:
        self.executing.set()
        try:
            if self.gate is not None:
                self.gate.wait(10)
            started = time.perf_counter()
            n_tokens = sum(c.size for c in chunks)
            if self.overhead or self.per_token:
                time.sleep(self.overhead + self.per_token * n_tokens)
            for chunk in chunks:
                if chunk.request.id in self.fail_for:
                    raise RuntimeError(f"fake decode error in {chunk.request.id}")
            with self._lock:
                sampled = self._run(chunks, n_tokens)
            self.step_times.append((started, time.perf_counter()))
            return sampled
        finally:
            self.executing.clear()

    @property
    def drafts_from_model(self) -> bool:
        return self.draft_model is not None

    def propose_drafts(self, wants) -> list[list[int]]:
        self.drafts_asked += [(seq_id, k) for seq_id, _, k in wants]
        return [self.draft_model([int(t) for t in text], k) for _, text, k in wants]

    def _run(self, chunks: list[Chunk], n_tokens: int) -> list[list[int]]:
        if n_tokens > self.n_batch:
            self._violation(f"a step of {n_tokens} tokens exceeds n_batch {self.n_batch}")
        seqs = [c.request.seq_id for c in chunks]
        if len(set(seqs)) != len(seqs):
            self._violation(f"a sequence appears twice in one step: {seqs}")
        sampled = []
        record = []
        for chunk in chunks:
            request = chunk.request
            kv = self.kv[request.seq_id]
            if chunk.start != len(kv):
                self._violation(
                    f"{request.id}: chunk starts at {chunk.start} but seq {request.seq_id} "
                    f"holds {len(kv)} tokens"
                )
            kv.extend(chunk.tokens)
            known = list(kv)  # what the model has read when it samples the first token
            kv.extend(chunk.draft)
            if len(kv) > self.ctx_per_seq:
                self._violation(f"seq {request.seq_id} holds {len(kv)} > {self.ctx_per_seq}")
            record.append((request.id, request.seq_id, chunk.start, chunk.size, chunk.sample))
            if chunk.sample:
                # As the runner verifies a draft: the model's token at each drafted position
                # while it agrees, then the first that differs (or the one after them all).
                script = self.scripts.get(request.id)
                index = len(request.output_ids)
                tokens = []
                for guess in (*chunk.draft, None):
                    at = index + len(tokens)
                    tokens.append(script[at] if script and at < len(script)
                                  else next_token(known))  # fmt: skip
                    if tokens[-1] != guess:
                        break
                    known.append(guess)
                sampled.append(tokens)
        used = sum(len(kv) for kv in self.kv.values())
        if used > self.n_ctx:
            self._violation(f"{used} KV cells used > n_ctx {self.n_ctx}")
        self.steps.append(record)
        return sampled

    def logprobs(self, request: Request, token: int, index: int = 0) -> StepLogprobs:
        """The fake model's distribution: the sampled token at 1/2, the next ids at 1/4, 1/8..."""
        self.logprobs_asked.append(request.id)

        def entry(rank: int) -> TokenLogprob:
            token_id = (token + rank) % self.n_vocab
            return TokenLogprob(token_id, self.piece(token_id), -(rank + 1) * math.log(2))

        return StepLogprobs(entry(0), tuple(entry(rank) for rank in range(request.params.logprobs)))

    def _violation(self, message: str) -> None:
        self.violations.append(message)
        raise AssertionError(message)

    # --- readings ----------------------------------------------------------------------------

    def kv_used(self) -> int:
        with self._lock:
            return sum(len(kv) for kv in self.kv.values())

    def chunks_of(self, request_id: str) -> list[tuple[str, int, int, int, bool]]:
        return [c for step in list(self.steps) for c in step if c[0] == request_id]

    def info(self) -> dict:
        return {"description": "fake", "size_bytes": 1000, "n_ctx": self.n_ctx}

    def close(self) -> None:
        if self.executing.is_set():  # llama.cpp would free the model under llama_decode
            self.violations.append("the runner was closed during a step")
        self.closed = True


def draft_model_of(accuracy: float, seed: int = 0):
    """A fake draft model that guesses the fake model's next token with chance `accuracy`
    (wrong guesses are a letter the fake model did not pick)."""
    rng = random.Random(seed)

    def draft(text: list[int], k: int) -> list[int]:
        text, guesses = list(text), []
        for _ in range(k):
            token = next_token(text)
            guess = token if rng.random() < accuracy else ord("a") + (token - ord("a") + 1) % 26
            guesses.append(guess)
            text.append(guess)
        return guesses

    return draft


def alone_output(prompt: str, max_tokens: int) -> str:
    """What the fake model answers for `prompt` when it runs alone: the reference output."""
    kv = char_tokens(prompt)
    out = []
    for _ in range(max_tokens):
        token = next_token(kv)
        out.append(chr(token))
        kv.append(token)
    return "".join(out)


def wait_until(condition, timeout: float = 5.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def ask(prompt, params: SamplingParams | None = None, **fields) -> GenerationRequest:
    """A request as the web side would build it: `prompt` text or token ids."""
    return GenerationRequest(prompt, params or SamplingParams(), **fields)


def wall_of(perf: float) -> float:
    """A time.perf_counter() reading as the wall clock a request carries (arrived_wall)."""
    return time.time() - (time.perf_counter() - perf)


def engines_on(runner_factory, **engine_kwargs):
    """An EngineHost's engine factory for tests: an Engine in this process on the runner that
    `runner_factory(config)` makes (a FakeRunner). The appliance itself runs every model in a
    runner process (inference.serving.supervisor)."""

    def start(spec) -> Engine:
        return Engine(runner_factory(spec.config), name=spec.name, **engine_kwargs).start()

    return start


class FakeVisionRunner(FakeRunner):
    """The fake with a vision projector: an image is `image_tokens` positions whose pseudo ids
    come from inference.engine.vision as the real runner's do, and whose embeddings are rows
    naming the image. It checks what the real runner needs of a step: a chunk is a run of text
    and then of one image, ending where that image ends at the latest; an image the projector
    wants `whole` is never cut; no draft holds a pseudo id."""

    takes_images = True
    image_problem = None

    def __init__(self, *, image_tokens: int = 8, whole: bool = False, mrope: bool = False,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.image_tokens = image_tokens
        self.whole = whole
        self.mrope = mrope  # images carry M-RoPE positions (one row of them: still indexes)
        self.encoded: list[str] = []  # image digests, one per encode
        self.encode_gate: threading.Event | None = None  # when set up, encodes wait for it
        self.encoding = threading.Event()  # set once an encode has begun
        self.undecodable: set[str] = set()  # digests whose picture does not decode
        self.shared: list[bool] = []  # share_cores's word before each step

    def share_cores(self, encoding: bool) -> None:
        self.shared.append(encoding)

    def hold(self, seq_id: int, spans) -> None:
        pass  # an image's positions are its indexes here, as without M-RoPE

    def read_images(self, prompt: str, images, add_special: bool):
        ids, spans = [], []
        for n, part in enumerate(prompt.split(MEDIA_MARKER)):
            ids += char_tokens(part)
            if n < len(images):
                if images[n].digest in self.undecodable:
                    raise Refused("the image could not be decoded", kind=RefusalKind.INVALID,
                                  field="images")  # fmt: skip
                key = image_key("fake projector", images[n].digest)
                n_tokens = self.image_tokens
                mrope = None
                if self.mrope:  # t, y, x, z as libmtmd places a 1 x n_tokens image
                    offsets = np.zeros((4, n_tokens), dtype=np.int32)
                    offsets[2] = np.arange(n_tokens)
                    mrope = (offsets, np.array([[1], [1], [1], [0]], dtype=np.int32)
                             .repeat(n_tokens, axis=1))  # fmt: skip
                spans.append(ImageSpan(len(ids), n_tokens, key, images[n].digest, self.whole,
                                       n_pos=n_tokens, mrope=mrope))  # fmt: skip
                ids += media_ids(key, self.image_tokens)
        return MediaPrompt(ids, spans)

    def encode_image(self, prompt, index: int):
        self.encoding.set()
        if self.encode_gate is not None:
            self.encode_gate.wait(10)
        span = prompt.spans[index]
        self.encoded.append(span.digest)
        return np.full((span.n_tokens, 4), index, dtype=np.float32)

    def free_media(self, prompt) -> None:
        pass

    def execute(self, chunks: list[Chunk]) -> list[list[int]]:
        for chunk in chunks:
            if any(token < 0 for token in chunk.draft):
                self._violation(f"{chunk.request.id}: a draft holds an image's pseudo id")
            if chunk.request.media:
                self._check_image_rows(chunk)
        return super().execute(chunks)

    def _check_image_rows(self, chunk: Chunk) -> None:
        tokens = chunk.tokens
        first = next((n for n, token in enumerate(tokens) if token < 0), len(tokens))
        if first == len(tokens):
            return
        if any(token >= 0 for token in tokens[first:]):
            self._violation(f"{chunk.request.id}: text follows an image in one chunk")
        begin, end = chunk.start + first, chunk.start + len(tokens)
        span = next((s for s in chunk.request.media if s.start <= begin < s.end), None)
        if span is None or end > span.end:
            self._violation(f"{chunk.request.id}: image rows {begin}-{end} cross an image's end")
        if span.whole and (end != span.end or begin > max(span.start, chunk.request.cached_tokens)):
            self._violation(f"{chunk.request.id}: a whole image was cut ({begin}-{end})")
