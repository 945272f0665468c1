"""Embeddings: what an embedding request is, how its inputs are checked and packed into decodes,
and what comes back. Pure Python, no llama.cpp (the runner computes; see runner.LlamaRunner.embed).

    future = engine.embed(["text", [1, 2, 3]], truncate=True)  # Engine.embed: start()
    future.result().vectors(normalised=True)  # lists of floats, L2 length 1 as Ollama's

Rules, checked once, in the process that has the vocabulary (the runner's):
1. A text is tokenized with the model's special tokens (BOS/EOS as its tokenizer adds them); a
   token array is taken as it is, every id in [0, n_vocab).
2. An input longer than `limit` tokens (the runner's embedding context) is cut to `limit` with
   truncate, and refused otherwise (PromptTooLong): it is never pooled over two ubatches.
3. Inputs are packed in order into groups of at most `limit` tokens and `max_seqs` sequences:
   each group is one llama_decode, each input its own sequence id. A text must give the same
   vector alone or with others (tested within 1e-5); on CPU that holds only with one input per
   decode (runner.EMBED_MAX_SEQS says why), so that is what the runner asks for.
4. A request is computed TURN_INPUTS inputs at a time, each turn queued behind whatever the
   engine thread was asked meanwhile: requests computed at once take turns, so a short one (a
   reranking of 5 documents) is not held behind a long one (1,000) for its whole length.
"""

import array
import base64
import math
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass

from inference.engine.engine import PromptTooLong
from inference.engine.params import InvalidParams
from inference.engine.refusals import RefusalKind, Refused

MAX_INPUTS = 512  # per request; OpenAI allows 2048, but one request should not hold a model long
MAX_TOTAL_TOKENS = 300_000  # over every input of a request (OpenAI's own per-request limit)
TURN_INPUTS = 8  # inputs computed per turn on the engine thread (rule 4)


class EmbeddingFailed(Refused, RuntimeError):
    """The model could not compute the embeddings (llama.cpp failed): not the client's fault."""

    kind = RefusalKind.FAILED


@dataclass(slots=True, frozen=True)
class Embedding:
    """The pooled vectors of one request, raw (not normalised): `dim` float32 per input, in
    `data`, in the machine's byte order. Small to pickle; the web side shapes it."""

    dim: int
    data: bytes
    token_counts: tuple[int, ...]  # tokens embedded per input (after truncation)
    seconds: float = 0.0  # the decodes

    @property
    def count(self) -> int:
        return len(self.token_counts)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)

    def floats(self, index: int, normalised: bool) -> array.array:
        vector = array.array("f")
        vector.frombytes(self.data[index * self.dim * 4 : (index + 1) * self.dim * 4])
        if normalised:
            # Ollama's normalisation: divide by the Euclidean length (a zero vector stays zero).
            norm = math.sqrt(math.fsum(x * x for x in vector))
            if norm > 0:
                vector = array.array("f", (x / norm for x in vector))
        return vector

    def vectors(self, normalised: bool) -> list[list[float]]:
        return [self.floats(i, normalised).tolist() for i in range(self.count)]

    def base64(self, index: int, normalised: bool) -> str:
        """One vector as OpenAI's base64 encoding: little-endian float32 bytes."""
        vector = self.floats(index, normalised)
        if sys.byteorder != "little":
            vector.byteswap()
        return base64.b64encode(vector.tobytes()).decode("ascii")


def prepare(
    inputs: list[str | list[int]],
    tokenize,
    *,
    n_vocab: int,
    limit: int,
    truncate: bool,
) -> list[list[int]]:
    """The token ids to embed, per input (rules 1 and 2). Raises InvalidParams("input") or
    PromptTooLong, naming the input by its index."""
    if not inputs:
        raise InvalidParams("input", "at least one input is needed")
    if len(inputs) > MAX_INPUTS:
        raise InvalidParams("input", f"at most {MAX_INPUTS} inputs per request, got {len(inputs)}")
    sequences = []
    total = 0
    for index, item in enumerate(inputs):
        where = f"input {index}" if len(inputs) > 1 else "the input"
        if isinstance(item, str):
            ids = tokenize(item)
        else:
            ids = list(item)
            for token in ids:
                if isinstance(token, bool) or not isinstance(token, int):
                    raise InvalidParams("input", f"{where}: token ids must be integers")
                if not 0 <= token < n_vocab:
                    raise InvalidParams(
                        "input", f"{where}: token id {token} is outside this model's "
                        f"vocabulary (0 to {n_vocab - 1})",
                    )  # fmt: skip
        if not ids:
            raise InvalidParams("input", f"{where} is empty")
        if len(ids) > limit:
            if not truncate:
                raise PromptTooLong(
                    f"{where} is {len(ids)} tokens but embeddings of this model hold {limit} "
                    "tokens per input"
                )
            ids = ids[:limit]
        total += len(ids)
        if total > MAX_TOTAL_TOKENS:
            raise InvalidParams("input", f"the inputs are over {MAX_TOTAL_TOKENS} tokens together")
        sequences.append(ids)
    return sequences


def pack(sequences: list[list[int]], max_tokens: int, max_seqs: int) -> list[list[int]]:
    """Indices of `sequences` grouped in order into decodes of at most `max_tokens` tokens and
    `max_seqs` sequences (rule 3); every sequence must fit `max_tokens` alone."""
    groups: list[list[int]] = []
    tokens = 0
    for index, ids in enumerate(sequences):
        if len(ids) > max_tokens:
            raise ValueError(f"a sequence of {len(ids)} tokens exceeds a decode of {max_tokens}")
        if not groups or tokens + len(ids) > max_tokens or len(groups[-1]) >= max_seqs:
            groups.append([])
            tokens = 0
        groups[-1].append(index)
        tokens += len(ids)
    return groups


def start(
    engine, inputs: list[str | list[int]], *, truncate: bool, query: str | None = None,
    truncate_left: bool = False,
) -> Future:  # fmt: skip
    """Check and tokenize `inputs` on this thread (raising InvalidParams or PromptTooLong at
    once), then embed them on the engine's thread, between steps, never beside a decode of the
    same model. With a `query`, the inputs are documents that a reranker scores against it
    (inference.engine.reranking): one float per document. The Future's result is an Embedding."""
    from inference.engine import reranking  # that module builds on this one

    runner = engine.runner
    limit = getattr(runner, "embed_limit", 0)
    if not limit:
        raise InvalidParams("model", "this runner cannot compute embeddings")
    if query is not None:
        sequences = reranking.prepare(query, inputs, runner, truncate=truncate,
                                      truncate_left=truncate_left)  # fmt: skip
    elif getattr(runner, "ranks", False):
        raise InvalidParams("model", reranking.IS_A_RERANKER)
    else:
        sequences = prepare(inputs, runner.tokenize, n_vocab=runner.n_vocab, limit=limit,
                            truncate=truncate)  # fmt: skip

    result: Future = Future()
    vectors: list[bytes] = []
    seconds = [0.0]

    def turn() -> None:
        started = time.perf_counter()
        part = sequences[len(vectors) : len(vectors) + TURN_INPUTS]
        vectors.extend(runner.embed(part))
        engine.telemetry.record_pooled(len(part), sum(len(ids) for ids in part),
                                       ranked=query is not None)  # fmt: skip
        seconds[0] += time.perf_counter() - started
        if len(vectors) < len(sequences):
            engine.on_engine_thread(turn).add_done_callback(failed)
            return
        result.set_result(Embedding(len(vectors[0]) // 4, b"".join(vectors),
                                    tuple(len(ids) for ids in sequences), seconds[0]))  # fmt: skip

    def failed(future: Future) -> None:
        if future.exception() is not None:
            result.set_exception(future.exception())

    engine.on_engine_thread(turn).add_done_callback(failed)
    return result
