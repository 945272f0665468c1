"""A draft model: a small GGUF with the target's vocabulary that guesses a stream's next tokens.

Speculation's third source of drafts (inference.engine.speculation): where a stream's own text
and its partition's table predict nothing, a small model of the same family reads the stream
and writes a few tokens greedily; the target verifies them in its batched step as it verifies
any draft, so the answer is the same whatever the draft model says. It pays where a step of the
target costs about the same for one token as for several (a GPU, a large model bound by memory
bandwidth); on a small CPU model it rarely does, and the policy then stops asking for it.

It runs in the runner process beside the target (it calls llama.cpp), on a context of its own
with one sequence per target sequence id. Each sequence keeps the tail of its stream's text it
has read (`held`): before drafting, what the stream added since is read, and whatever no longer
agrees (drafts the target did not keep, a slot taken by another conversation) is removed from
its KV first, as llama.cpp's own draft loop does.
"""

import ctypes
import logging
import os
import time
from collections.abc import Sequence

import llama_cpp as ll
import numpy as np

from inference.engine.runner_config import DRAFT_CATCH_UP, DRAFT_WINDOW, KV_TYPES

log = logging.getLogger(__name__)

# The most of a stream's text the draft model reads: a guess at the next few tokens needs the
# recent text, not a long document. A stream it has not followed (or that outgrew WINDOW, its
# KV cells per sequence) is read again from its last CATCH_UP tokens.
CATCH_UP = DRAFT_CATCH_UP
WINDOW = DRAFT_WINDOW
DRAFT_ROOM = 32  # cells a sequence keeps free for drafting (speculation.policy.MAX_DRAFT)
# llama.cpp's own rule for a draft model's vocabulary (common/speculative.cpp): the same type
# and special tokens, sizes within 128, and the same text for every token from id 5 on.
VOCAB_SIZE_SLACK = 128
VOCAB_CHECK_FROM = 5


class DraftModelError(RuntimeError):
    """The draft model cannot be used with this target (or cannot be loaded at all)."""


def incompatibility(target, draft) -> str | None:
    """Why two llama.cpp vocabularies cannot share drafts (None: they can)."""
    if ll.llama_vocab_type(target) != ll.llama_vocab_type(draft):
        return "its tokenizer is of another type"
    for what, read in (("beginning-of-text", ll.llama_vocab_bos),
                       ("end-of-text", ll.llama_vocab_eos)):  # fmt: skip
        if read(target) != read(draft):
            return f"its {what} token differs"
    if ll.llama_vocab_get_add_bos(target) != ll.llama_vocab_get_add_bos(draft):
        return "it adds a beginning-of-text token where the model does not, or the reverse"
    n_target, n_draft = ll.llama_vocab_n_tokens(target), ll.llama_vocab_n_tokens(draft)
    if abs(n_target - n_draft) > VOCAB_SIZE_SLACK:
        return f"its vocabulary has {n_draft} tokens, the model's {n_target}"
    for token in range(VOCAB_CHECK_FROM, min(n_target, n_draft)):
        if ll.llama_vocab_get_text(target, token) != ll.llama_vocab_get_text(draft, token):
            return f"token {token} is a different text in its vocabulary"
    return None


class DraftModel:
    def __init__(self, path: str, target_vocab, *, sequences: int, n_threads: int,
                 n_gpu_layers: int, kv_type: str, flash_attn: bool,
                 use_extra_bufts: bool = True):  # fmt: skip
        """Load the GGUF at `path` for a target with `target_vocab` and `sequences` sequence
        ids. Raises DraftModelError when it cannot load or its vocabulary is not the target's."""
        if not os.path.isfile(path):
            raise DraftModelError(f"draft model file not found: {path}")
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 999 if n_gpu_layers < 0 else n_gpu_layers
        # As the model's own (runner_config): off where the host's AMX is not delivered.
        params.use_extra_bufts = use_extra_bufts
        self.model = ll.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise DraftModelError(f"llama.cpp could not load the draft model {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        problem = incompatibility(target_vocab, self.vocab)
        if problem:
            ll.llama_model_free(self.model)
            raise DraftModelError(f"the draft model cannot draft for this model: {problem}")
        self.path = path
        self.sequences = sequences
        self.n_batch = CATCH_UP * 2
        ctx = ll.llama_context_default_params()
        ctx.n_ctx = WINDOW * sequences
        ctx.n_batch = ctx.n_ubatch = self.n_batch
        ctx.n_seq_max = sequences
        ctx.n_threads = ctx.n_threads_batch = n_threads
        ctx.kv_unified = False  # one KV stream per sequence, as the target's (runner.py)
        ctx.type_k = ctx.type_v = KV_TYPES[kv_type]
        ctx.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn
                               else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)  # fmt: skip
        ctx.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, ctx)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise DraftModelError("llama.cpp could not create a context for the draft model")
        self.memory = ll.llama_get_memory(self.ctx)
        # Drafted ids must be ids the target has: the argmax looks at the shared part only.
        self.n_vocab = min(ll.llama_vocab_n_tokens(target_vocab),
                           ll.llama_vocab_n_tokens(self.vocab))  # fmt: skip
        self._vocab_rows = ll.llama_vocab_n_tokens(self.vocab)
        self.batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self.held: list[list[int]] = [[] for _ in range(sequences)]
        self.start: list[int] = [0] * sequences  # where in its stream's text `held` begins
        self.size_bytes = int(ll.llama_model_size(self.model))
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        self.description = desc.value.decode(errors="replace")
        self.read_s = 0.0  # the last propose's reading of the streams' new text
        self.round_s: float | None = None  # the last propose's seconds per drafting decode
        self._closed = False

    def propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """For each (sequence id, the stream's text so far, k): up to k tokens the draft model
        expects next, greedily; all streams' reading and drafting batched together. A failed
        decode starts every sequence of the call afresh next time, and raises."""
        try:
            return self._propose(wants)
        except RuntimeError:
            for seq_id, _, _ in wants:
                if 0 <= seq_id < self.sequences:
                    self._reset(seq_id)
            raise

    def _propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        started = time.perf_counter()
        pending: list[tuple[int, int, int]] = []  # (want, token, position) still to read
        final: dict[int, int] = {}  # want -> index in pending of its newest token
        for n, (seq_id, text, k) in enumerate(wants):
            if not 0 <= seq_id < self.sequences or k <= 0 or not len(text):
                continue
            unread = self._to_read(seq_id, text)
            if any(not 0 <= token < self._vocab_rows for token, _ in unread):
                # An id the draft model has not (the vocabularies may differ by a few ids at
                # the end; an API may send raw ids): no draft for this stream now.
                self._reset(seq_id)
                continue
            pending += [(n, token, position) for token, position in unread]
            final[n] = len(pending) - 1
        drafts: list[list[int]] = [[] for _ in wants]
        # Reading: every stream's unread text, n_batch tokens a decode; a stream's newest token
        # (always unread: see _to_read) gives its first guess, read before the next decode.
        for begin in range(0, len(pending), self.n_batch):
            part = pending[begin : begin + self.n_batch]
            guessing = {n: i - begin for n, i in final.items() if begin <= i < begin + len(part)}
            self._decode([(wants[n][0], token, position, guessing.get(n) == i)
                          for i, (n, token, position) in enumerate(part)])  # fmt: skip
            for n, row in guessing.items():
                drafts[n] = [self._argmax(row)]
        read = time.perf_counter()
        # Drafting: one more token for every stream still short of its k, a decode a round.
        rounds = 0
        while True:
            entries = []
            for n in final:
                seq_id = wants[n][0]
                if drafts[n] and len(drafts[n]) < wants[n][2] and len(self.held[seq_id]) < WINDOW:
                    entries.append((n, seq_id, drafts[n][-1]))
            if not entries:
                break
            self._decode([(seq_id, token, len(self.held[seq_id]), True)
                          for _, seq_id, token in entries])  # fmt: skip
            rounds += 1
            for row, (n, seq_id, token) in enumerate(entries):
                self.held[seq_id].append(token)
                drafts[n].append(self._argmax(row))
        self.read_s = read - started
        # What one more drafted token costs: a drafting decode (the reading gives the first).
        if rounds:
            self.round_s = (time.perf_counter() - read) / rounds
        return drafts

    def _reset(self, seq_id: int) -> None:
        ll.llama_memory_seq_rm(self.memory, seq_id, 0, -1)
        self.held[seq_id] = []
        self.start[seq_id] = 0

    def warm_up(self) -> None:
        """A few tokens through the draft model at load, then forgotten: its first decode (the
        kernels' first run) is not in someone's answer, and a CPU that cannot run them fails
        here, where the runner's load fails, not mid-stream."""
        self.propose([(0, list(range(VOCAB_CHECK_FROM, VOCAB_CHECK_FROM + 8)), 2)])
        self._reset(0)
        self.round_s = None

    def _to_read(self, seq_id: int, text: Sequence[int]) -> list[tuple[int, int]]:
        """The (token, position) pairs sequence `seq_id` must read to hold `text`'s tail: the
        KV past what still agrees is removed first. The newest token is always read again (its
        logits give the first guess)."""
        held, start = self.held[seq_id], self.start[seq_id]
        tail = [int(t) for t in text[start : len(text)]] if start < len(text) else []
        same = 0
        for mine, theirs in zip(held, tail, strict=False):
            if mine != theirs:
                break
            same += 1
        same = min(same, len(tail) - 1)  # the newest token is read for its logits
        unread = len(tail) - same
        if start >= len(text) or unread > CATCH_UP or len(tail) + DRAFT_ROOM >= WINDOW:
            # Not this stream's text, too far behind, or out of room: read its recent tail.
            start = max(0, len(text) - CATCH_UP)
            tail = [int(t) for t in text[start:]]
            same = 0
        if not ll.llama_memory_seq_rm(self.memory, seq_id, same, -1):
            # A model whose state cannot be cut (recurrent layers): read the tail afresh.
            ll.llama_memory_seq_rm(self.memory, seq_id, 0, -1)
            start = max(0, len(text) - CATCH_UP)
            tail = [int(t) for t in text[start:]]
            same = 0
        self.start[seq_id] = start
        self.held[seq_id] = tail
        return [(tail[i], i) for i in range(same, len(tail))]

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """(sequence id, token, position in the sequence, logits?) as one llama_decode."""
        batch = self.batch
        for i, (seq_id, token, position, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        rc = ll.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"the draft model's llama_decode returned {rc}")

    def _argmax(self, row: int) -> int:
        logits = ll.llama_get_logits_ith(self.ctx, row)
        values = np.ctypeslib.as_array(logits, shape=(self._vocab_rows,))
        return int(np.argmax(values[: self.n_vocab]))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)
