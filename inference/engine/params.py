"""Sampling parameters: one validated, immutable dataclass.

Every number is bounds-checked here, before anything reaches llama.cpp, so a negative or absurd
value becomes a clear error naming the field (llama.cpp's own server once corrupted memory on a
negative parameter). A grammar's size is checked here too; whether llama.cpp can parse it only
the runner can tell, and it does so at submit (inference.engine.runner, `validate`).
"""

import math
from dataclasses import dataclass, field

from inference.engine.refusals import RefusalKind, Refused


class InvalidParams(Refused, ValueError):
    """A sampling parameter is out of range; `field` names it for API error messages."""

    kind = RefusalKind.INVALID

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}", field=field_name)


MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TOKENS_LIMIT = 1 << 20
SEED_LIMIT = (1 << 32) - 1
MAX_TOP_LOGPROBS = 20  # OpenAI's and Ollama's bound on the likeliest tokens listed per step
MAX_GRAMMAR_CHARS = 64 * 1024  # GBNF text; llama.cpp parses it for every request that sends one
# llama.cpp parses nested groups recursively: 20,000 open parentheses overflow its stack (a
# crashed runner). A JSON schema's grammar nests about one level per maxLength character.
MAX_GRAMMAR_NESTING = 1100
MAX_GRAMMAR_TRIGGERS = 8
MAX_TRIGGER_LENGTH = 256
MAX_LOGIT_BIAS = 300  # OpenAI's bound on logit_bias entries
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range, -100 (a ban) to 100 (a certainty)
TOKEN_ID_LIMIT = 1 << 31  # llama_token is int32; the vocabulary's own size is the runner's check

# (low, high) inclusive for every numeric field.
_FLOAT_BOUNDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 5.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "typical_p": (0.0, 1.0),
    "repeat_penalty": (0.0, 5.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "top_k": (0, 100_000),
    "repeat_last_n": (-1, 1 << 16),
    "max_tokens": (1, MAX_TOKENS_LIMIT),
}
# The same for the integers that may be None (not asked).
_OPTIONAL_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "seed": (0, SEED_LIMIT),
    "logprobs": (0, MAX_TOP_LOGPROBS),
}


def _nesting(grammar: str) -> int:
    """The deepest nesting of ( ) groups in GBNF text, outside literals, classes and comments."""
    depth = deepest = 0
    quote = None  # '"' inside a literal, "]" inside a character class
    chars = iter(grammar)
    for char in chars:
        if quote is not None:
            if char == "\\":
                next(chars, None)
            elif char == quote:
                quote = None
        elif char == '"':
            quote = '"'
        elif char == "[":
            quote = "]"
        elif char == "#":
            for rest in chars:
                if rest in "\r\n":
                    break
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


# The fields a model's saved defaults may set (its page's form, a pulled params layer): the
# sampling knobs, never a grammar, which shapes one request's output.
DEFAULTABLE = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
               "presence_penalty", "frequency_penalty", "seed", "max_tokens", "stop")  # fmt: skip


def usable_defaults(saved: object, fields: tuple[str, ...] = DEFAULTABLE) -> dict:
    """The part of saved sampling defaults a request can run with: the `fields` whose value
    passes SamplingParams' own checks (a stop string alone becomes a list). Whatever else is
    there is left out, so a stale or odd saved value never refuses a request."""
    kept: dict = {}
    for key, value in (saved.items() if isinstance(saved, dict) else ()):
        if key not in fields:
            continue
        if key == "stop":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list | tuple):
                continue
        try:
            SamplingParams(**{key: tuple(value) if key == "stop" else value})
        except (InvalidParams, TypeError):
            continue
        kept[key] = list(value) if key == "stop" else value
    return kept


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick each output token. temperature 0 means greedy (deterministic)."""

    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    typical_p: float = 1.0  # locally typical sampling; 1.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # -1: the whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed per request
    # Log-probabilities of the answer's tokens (OpenAI's and Ollama's logprobs): None, not
    # asked; n, each sampled token's and the n likeliest tokens at its step (0 to 20).
    logprobs: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)
    # GBNF (llama.cpp's grammar format, root rule "root"): only tokens the grammar allows are
    # sampled. With triggers it is lazy: the text is free until the model samples one of these
    # words, and from there on (the word included) it follows the grammar; how a tool call's
    # JSON is held to its schema once "<tool_call>" appears. A trigger counts only where it is
    # one token of the model's vocabulary (a special token such as Qwen's <tool_call>): a word
    # that ends inside a longer token would hand the grammar text it cannot take, which aborts
    # llama.cpp. A lazy grammar with no such trigger is not applied.
    grammar: str | None = None
    grammar_triggers: tuple[str, ...] = field(default_factory=tuple)
    # Added to a token's logit before any other sampler (llama.cpp's logit-bias sampler), as
    # (token id, bias) pairs: OpenAI's logit_bias, -100 bans a token, +100 all but forces it.
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    # The end-of-generation tokens are never sampled (llama-server's ignore_eos: the answer
    # runs to max_tokens or a stop string).
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for name, (lo, hi) in _FLOAT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidParams(name, f"must be a number, got {value!r}")
            if not math.isfinite(value) or not lo <= value <= hi:
                raise InvalidParams(name, f"must be between {lo} and {hi}, got {value}")
        optional = ((name, bounds) for name, bounds in _OPTIONAL_INT_BOUNDS.items()
                    if getattr(self, name) is not None)  # fmt: skip
        for name, (lo, hi) in (*_INT_BOUNDS.items(), *optional):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidParams(name, f"must be an integer, got {value!r}")
            if not lo <= value <= hi:
                raise InvalidParams(name, f"must be between {lo} and {hi}, got {value}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, tuple | list):
            raise InvalidParams("stop", "must be a string or a list of strings")
        if len(stop) > MAX_STOP_STRINGS:
            raise InvalidParams("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
        for item in stop:
            if not isinstance(item, str) or not 1 <= len(item) <= MAX_STOP_LENGTH:
                raise InvalidParams(
                    "stop", f"each stop string must be 1 to {MAX_STOP_LENGTH} characters"
                )
        object.__setattr__(self, "stop", tuple(stop))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidParams("ignore_eos", "must be true or false")
        self._check_grammar()
        self._check_logit_bias()

    def _check_logit_bias(self) -> None:
        pairs = self.logit_bias
        if not isinstance(pairs, tuple | list):
            raise InvalidParams("logit_bias", "must be (token id, bias) pairs")
        if len(pairs) > MAX_LOGIT_BIAS:
            raise InvalidParams("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens, got {len(pairs)}")
        checked = []
        for pair in pairs:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidParams("logit_bias", "must be (token id, bias) pairs")
            token, bias = pair
            if isinstance(token, bool) or not isinstance(token, int):
                raise InvalidParams("logit_bias", f"a token id must be an integer, got {token!r}")
            if not 0 <= token < TOKEN_ID_LIMIT:
                raise InvalidParams("logit_bias", f"token id {token} is out of range")
            if isinstance(bias, bool) or not isinstance(bias, int | float):
                raise InvalidParams("logit_bias", f"a bias must be a number, got {bias!r}")
            if not math.isfinite(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise InvalidParams("logit_bias", f"a bias must be between -{LOGIT_BIAS_LIMIT:g} "
                                    f"and {LOGIT_BIAS_LIMIT:g}, got {bias}")  # fmt: skip
            checked.append((token, float(bias)))
        object.__setattr__(self, "logit_bias", tuple(checked))

    def _check_grammar(self) -> None:
        grammar, triggers = self.grammar, self.grammar_triggers
        if grammar is not None:
            if not isinstance(grammar, str) or not grammar.strip():
                raise InvalidParams("grammar", "must be a non-empty GBNF text")
            if len(grammar) > MAX_GRAMMAR_CHARS:
                raise InvalidParams(
                    "grammar", f"at most {MAX_GRAMMAR_CHARS} characters, got {len(grammar)}"
                )
            if "\0" in grammar:  # it crosses to C as a NUL-terminated string
                raise InvalidParams("grammar", "must not contain NUL characters")
            if _nesting(grammar) > MAX_GRAMMAR_NESTING:
                raise InvalidParams(
                    "grammar", f"nests groups deeper than {MAX_GRAMMAR_NESTING} levels"
                )
        if not isinstance(triggers, tuple | list):
            raise InvalidParams("grammar_triggers", "must be a list of trigger words")
        if triggers and grammar is None:
            raise InvalidParams("grammar_triggers", "triggers need a grammar")
        if len(triggers) > MAX_GRAMMAR_TRIGGERS:
            raise InvalidParams("grammar_triggers", f"at most {MAX_GRAMMAR_TRIGGERS} triggers")
        for item in triggers:
            if not isinstance(item, str) or not 1 <= len(item) <= MAX_TRIGGER_LENGTH:
                raise InvalidParams(
                    "grammar_triggers", f"each trigger must be 1 to {MAX_TRIGGER_LENGTH} characters"
                )
            if "\0" in item:
                raise InvalidParams("grammar_triggers", "must not contain NUL characters")
        object.__setattr__(self, "grammar_triggers", tuple(triggers))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
