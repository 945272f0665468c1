"""Which turns of a long chat the model still reads: the system prompt and the most recent turns
that fit the context, with room left for the answer.

The web process has no tokenizer (only runner processes load llama.cpp), so sizes are
estimates: an answer's own output token count when it has one, otherwise its characters over
the characters per token that this conversation's answers measured (3 when none did), with a
margin. A window that is still too long is refused by the engine with the exact numbers.

Why the window moves in steps: the runner's prefix cache reuses the KV of the longest prompt
prefix it has already computed. Dropping one old turn at every new turn would change the
prompt right after the system prompt each time, and every turn would prefill the whole window
again. Instead the window's start stays put until the kept turns no longer fit, then jumps
forward far enough that they use at most KEEP_AFTER_STEP of the budget; the turns after such a
step share the same start, and so a prefix, until the window fills up again.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CHARS_PER_TOKEN = 3.0  # conservative for English with small-vocabulary tokenizers
MARGIN = 1.15  # estimates err on the long side
TURN_OVERHEAD_TOKENS = 8  # the template's role markers around each message
KEEP_AFTER_STEP = 0.5  # after a step, the kept turns fill at most half of the budget


@dataclass(frozen=True, slots=True)
class Sized:
    """A message as the window sees it."""

    role: str
    chars: int
    tokens: int | None = None  # measured (an answer's output tokens), when known
    extra_tokens: int = 0  # beside its text: its images' (dashboard.chat.turn_request)


@dataclass(frozen=True, slots=True)
class Window:
    start: int  # index of the first kept message
    estimated_tokens: int  # of the kept messages (system prompt included)


def answer_room(n_ctx: int) -> int:
    """Tokens kept free for the answer when choosing what to leave out."""
    return max(256, min(2048, n_ctx // 4))


def chars_per_token(messages: Sequence[Sized]) -> float:
    chars = sum(m.chars for m in messages if m.tokens)
    tokens = sum(m.tokens for m in messages if m.tokens)
    if tokens < 32:  # too little measured to trust
        return DEFAULT_CHARS_PER_TOKEN
    return min(6.0, max(1.5, chars / tokens))


def estimate(message: Sized, ratio: float) -> int:
    if message.tokens:
        return message.tokens + message.extra_tokens + TURN_OVERHEAD_TOKENS
    return math.ceil(message.chars / ratio * MARGIN) + message.extra_tokens + TURN_OVERHEAD_TOKENS


def choose(
    messages: Sequence[Sized], *, system_chars: int, n_ctx: int, previous_start: int = 0
) -> Window:
    """The window over `messages` (oldest first; the last one is the new turn and is always
    kept). `previous_start`: where the last turn's window began, kept while everything fits."""
    ratio = chars_per_token(messages)
    sizes = [estimate(m, ratio) for m in messages]
    system = estimate(Sized("system", system_chars), ratio) if system_chars else 0
    budget = n_ctx - answer_room(n_ctx) - system
    start = min(max(previous_start, 0), max(len(messages) - 1, 0))
    if sum(sizes[start:]) <= budget:
        return Window(start, system + sum(sizes[start:]))
    # The step: drop from the oldest end until the rest fits in KEEP_AFTER_STEP of the budget,
    # never splitting a question from its answer (a window starts at a user message).
    target = budget * KEEP_AFTER_STEP
    last = len(messages) - 1
    while start < last and (sum(sizes[start:]) > target or messages[start].role != "user"):
        start += 1
    return Window(start, system + sum(sizes[start:]))
