"""An answer's log-probabilities in the API's shapes, handed out with the text their tokens wrote.

The engine puts each sampled token's log-probabilities on its token event (a StepLogprobs of
inference.engine.events, a dict here). A `LogprobTrail` (one per Run that asked) takes them in:

1. A token's text may be held back by the engine (a part of a character, text that may begin a
   stop string): its entry waits, and is ready once an event brings text again.
2. A view takes the ready entries when it sends a chunk, so each chunk carries the entries of
   the tokens whose text it holds or held back before (an answer parser may hold text too).
3. At the end every entry still waiting goes with the last chunk, except when a stop string
   ended the answer: the tokens that wrote it wrote no text of the answer, and are dropped (as
   llama-server drops them). The entries are then the tokens of the text, in order.

Shapes: OpenAI's chat entry (`token`, `logprob`, `bytes`, `top_logprobs` of the same three) is
also Ollama's (`top_logprobs` left out when none were asked, as Ollama omits it), and OpenAI's
legacy completions have their own columns (`tokens`, `token_logprobs`, `top_logprobs` as
{token: logprob}, `text_offset`).
"""

from typing import TypedDict


class TokenEntry(TypedDict, total=False):
    token: str  # its bytes as text; a part of a character reads as U+FFFD
    logprob: float
    bytes: list[int]
    top_logprobs: list["TokenEntry"]


class CompletionLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


def _token(candidate: dict) -> TokenEntry:
    piece = bytes(candidate["piece"])
    return {"token": piece.decode("utf-8", errors="replace"), "logprob": candidate["logprob"],
            "bytes": list(piece)}  # fmt: skip


def entry(step: dict) -> TokenEntry:
    """A token event's `logprobs` (StepLogprobs as a dict) as OpenAI chat's entry."""
    return {**_token(step["chosen"]), "top_logprobs": [_token(top) for top in step["top"]]}


class LogprobTrail:
    def __init__(self) -> None:
        self._waiting: list[TokenEntry] = []  # tokens whose text is held back
        self._ready: list[TokenEntry] = []

    def feed(self, event: dict) -> None:
        """A token event (1.)."""
        step = event.get("logprobs")
        if step is not None:
            self._waiting.append(entry(step))
        if event["text"]:
            self._ready += self._waiting
            self._waiting = []

    def take(self) -> list[TokenEntry]:
        """The ready entries, once each (2.)."""
        ready, self._ready = self._ready, []
        return ready

    def end(self, done: dict) -> None:
        """The answer's done event: what waits is ready, or dropped after a stop string (3.)."""
        if done.get("stop") is None:
            self._ready += self._waiting
        self._waiting = []


def openai_choice(entries: list[TokenEntry]) -> dict | None:
    """A chat choice's (or chunk's) `logprobs`: None when it has no tokens."""
    return {"content": entries, "refusal": None} if entries else None


def ollama_entries(entries: list[TokenEntry]) -> list[TokenEntry]:
    return [{key: value for key, value in e.items() if key != "top_logprobs" or value}
            for e in entries]  # fmt: skip


class CompletionOffsets:
    """OpenAI's legacy completions logprobs, whose `text_offset` counts on over a stream."""

    def __init__(self) -> None:
        self.offset = 0

    def shape(self, entries: list[TokenEntry]) -> CompletionLogprobs | None:
        if not entries:
            return None
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            # The likeliest tokens and the sampled one, as OpenAI lists them (up to n + 1).
            "top_logprobs": [{**{t["token"]: t["logprob"] for t in e["top_logprobs"]},
                              e["token"]: e["logprob"]} for e in entries],  # fmt: skip
            "text_offset": offsets,
        }
