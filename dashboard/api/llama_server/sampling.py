"""llama-server's sampling and stopping fields (tools/server/server-schema.cpp), the one home of
what /completion and /infill share: `LlamaSampling` is the body's part (each route's request
subclasses it with its prompt fields), `sampling()` its values in the engine's names, `limits()`
what the route itself enforces while it reads the answer (n_predict 0, t_max_prompt_ms,
t_max_predict_ms, n_indent: dashboard.api.llama_server.answer and .limits), and
`settings_json()` the params as llama-server's generation_settings names them.

Every number is bounded as llama-server bounds it, or tighter where the engine is (a 400 names
the field). The engine's sampler chain is fixed, in llama-server's default order (penalties,
top_k, typ_p, top_p, min_p, temperature): `samplers` may leave samplers out (turning them off)
but not reorder them. A field llama-server has and this engine cannot honour (mirostat, DRY,
XTC, ... away from their off values) is a 400 naming it; any other unknown field is refused
(Strict).
"""

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from dashboard.api import rules
from dashboard.api.bodies import (
    GrammarText,
    JsonSchema,
    ModelName,
    Penalty,
    RepeatLastN,
    RepeatPenalty,
    Stop,
    Strict,
    TopK,
    Unit,
    refuse_if,
)
from inference.engine.params import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS,
    MAX_TOKENS_LIMIT,
    SEED_LIMIT,
    TOKEN_ID_LIMIT,
    SamplingParams,
)

# llama-server's default sampler order (common/common.h), by its names; this engine's chain
# follows it for the samplers it has.
SAMPLER_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                 "temperature")  # fmt: skip
# What leaving a sampler out of `samplers` turns off, as the engine's values.
SAMPLER_OFF = {"penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0,
                             "frequency_penalty": 0.0},
               "top_k": {"top_k": 0}, "typ_p": {"typical_p": 1.0}, "top_p": {"top_p": 1.0},
               "min_p": {"min_p": 0.0}}  # fmt: skip
# llama-server's other names for them (common_sampler_types_from_names' aliases).
SAMPLER_ALIASES = {"typical_p": "typ_p", "typical": "typ_p", "top-k": "top_k", "top-p": "top_p",
                   "nucleus": "top_p", "min-p": "min_p", "temp": "temperature",
                   "top-n-sigma": "top_n_sigma"}  # fmt: skip
# llama.cpp's infill sampler (llama_sampler_init_infill: it merges candidates that share a
# prefix and prefers the end of generation when no text candidate is likely). The engine has no
# such sampler; llama.vscode sends ["top_k", "top_p", "infill"], so it is accepted anywhere in
# the list and does nothing here.
INFILL_SAMPLER = "infill"
MAX_MS = 24 * 3600 * 1000  # a day: any time limit past it is none
# The longest response_fields entry (llama.vscode's: "timings/predicted_per_token_ms").
MAX_FIELD_CHARS = 64

TokenId = Annotated[int, Field(ge=0, lt=TOKEN_ID_LIMIT)]


def _sampler_names(value: Any) -> Any:
    if isinstance(value, list):
        return [SAMPLER_ALIASES.get(name, name) if isinstance(name, str) else name
                for name in value]  # fmt: skip
    return value


def _in_order(names: list[str]) -> list[str]:
    chain = [name for name in names if name != INFILL_SAMPLER]
    unknown = [name for name in chain if name not in SAMPLER_ORDER]
    if unknown:
        raise ValueError(f"unknown sampler {unknown[0]!r}; known: {', '.join(SAMPLER_ORDER)} "
                         f"(and {INFILL_SAMPLER}, which this engine does not have)")  # fmt: skip
    at = [SAMPLER_ORDER.index(name) for name in chain]
    if at != sorted(set(at)):
        raise ValueError("this engine's sampler chain has a fixed order (" +
                         ", ".join(SAMPLER_ORDER) + "): samplers may be left out, not "
                         "reordered or repeated")  # fmt: skip
    return names


def _bias_pairs(value: Any) -> Any:
    """llama-server's logit_bias forms → ((token id, bias), ...): pairs, or an object of token
    id → bias; a bias of false bans the token (-100 here, what OpenAI's ban is). Checked here
    whole, so that a 400 names logit_bias and says what is wrong."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list):
        raise ValueError("must be a list of [token id, bias] pairs or an object of them")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens, got {len(pairs)}")
    out = []
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ValueError("each entry must be a [token id, bias] pair")
        token, bias = pair
        if isinstance(token, str) and token.isdecimal():
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < TOKEN_ID_LIMIT:
            raise ValueError(f"token ids only (text is not supported), got {token!r}")
        bias = -LOGIT_BIAS_LIMIT if bias is False else bias
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not (
                -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT):  # fmt: skip
            raise ValueError(f"a bias is a number from -{LOGIT_BIAS_LIMIT:g} to "
                             f"{LOGIT_BIAS_LIMIT:g}, or false, got {bias!r}")  # fmt: skip
        out.append((token, float(bias)))
    return tuple(out)


LogitBiasPairs = Annotated[
    tuple[tuple[int, float], ...],
    BeforeValidator(
        _bias_pairs,
        json_schema_input_type=list[tuple[TokenId, float | bool]] | dict[str, float | bool],
    ),
]


def _off_unless(default: Any, name: str):
    return refuse_if(lambda v: v != default, f"{name} is not supported by this engine (only its "
                     f"off value, {default})")  # fmt: skip


class LlamaSampling(Strict):
    """The sampling and stopping fields /completion and /infill share (a `model` field besides,
    for a box with many)."""

    model: ModelName = ""
    stream: bool = False
    # -1 (or unset): the model's default (what /props shows), as a request's -1 is the server's
    # own -n there; 0: read the prompt into the cache and answer nothing (an editor's warm-up).
    # n_predict wins over its alias, as there.
    n_predict: Annotated[int, Field(ge=-1, le=MAX_TOKENS_LIMIT)] | None = None
    max_tokens: Annotated[int, Field(ge=-1, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=5.0)] | None = None
    top_k: TopK | None = None
    top_p: Unit | None = None
    min_p: Unit | None = None
    typical_p: Unit | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: RepeatLastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Field(ge=-1, le=SEED_LIMIT)] | None = None  # -1: a random one
    stop: Stop = None
    ignore_eos: bool = False
    logit_bias: LogitBiasPairs | None = None
    grammar: GrammarText | None = None  # GBNF: only what it allows is sampled
    json_schema: JsonSchema | None = None  # or a JSON schema, made a grammar
    samplers: Annotated[list[str], Field(max_length=16),
                        BeforeValidator(_sampler_names)] | None = None  # fmt: skip
    # The engine reuses a cached prefix whenever it can (within the caller's partition); reuse
    # never changes an answer.
    cache_prompt: bool = True
    t_max_prompt_ms: Annotated[int, Field(ge=-1, le=MAX_MS)] | None = None
    t_max_predict_ms: Annotated[int, Field(ge=-1, le=MAX_MS)] | None = None
    n_indent: Annotated[int, Field(ge=0, le=1 << 16)] | None = None
    response_fields: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_FIELD_CHARS)]],
        Field(max_length=64),
    ] | None = None  # fmt: skip
    # Accepted at their off values only: this engine has no such sampler or output.
    n_probs: Annotated[int, _off_unless(0, "n_probs")] = 0
    return_tokens: Annotated[bool, _off_unless(False, "return_tokens")] = False
    mirostat: Annotated[int, _off_unless(0, "mirostat")] = 0
    dry_multiplier: Annotated[float, _off_unless(0.0, "dry_multiplier")] = 0.0
    xtc_probability: Annotated[float, _off_unless(0.0, "xtc_probability")] = 0.0
    dynatemp_range: Annotated[float, _off_unless(0.0, "dynatemp_range")] = 0.0
    top_n_sigma: Annotated[float, refuse_if(lambda v: v > 0, "top_n_sigma is not supported by "
                                            "this engine (only off, -1)")] = -1.0  # fmt: skip

    @field_validator("samplers")
    @classmethod
    def _order(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _in_order(value)

    @field_validator("json_schema")
    @classmethod
    def _one_grammar(cls, value: dict | None, info: ValidationInfo) -> dict | None:
        rules.one_grammar(info.data.get("grammar"), value, "json_schema")
        return value

    @property
    def predict(self) -> int | None:
        """n_predict (or its alias), None when neither is set."""
        return self.n_predict if self.n_predict is not None else self.max_tokens

    def sampling(self) -> dict:
        """The engine's sampling params (n_predict 0: one token, which the route does not
        send)."""
        predict = self.predict
        bound = None if predict is None or predict < 0 else max(predict, 1)
        grammar = rules.format_grammar(self.json_schema) if self.json_schema is not None else None
        params = rules.sampling(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            typical_p=self.typical_p, repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=None if self.seed in (None, -1) else self.seed,
            max_tokens=bound, stop=self.stop,
            grammar=self.grammar or grammar, ignore_eos=self.ignore_eos or None,
            logit_bias=self.logit_bias or None,
        )  # fmt: skip
        for name in SAMPLER_OFF if self.samplers is not None else ():
            if name not in self.samplers:
                params.update(SAMPLER_OFF[name])
        return params

    def limits(self) -> "Limits":
        def ms(value: int | None) -> float | None:
            return value / 1000 if value is not None and value > 0 else None

        return Limits(warm_up=self.predict == 0, prompt_s=ms(self.t_max_prompt_ms),
                      predict_s=ms(self.t_max_predict_ms), n_indent=self.n_indent or 0)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Limits:
    """What the route enforces while it reads the answer (dashboard.api.llama_server.limits)."""

    warm_up: bool = False  # n_predict 0: the prompt is read, no text is answered
    prompt_s: float | None = None  # t_max_prompt_ms: the longest wait for the first token
    predict_s: float | None = None  # t_max_predict_ms, as llama-server applies it
    n_indent: int = 0  # the least indentation of a new line


def settings_json(p: SamplingParams) -> dict:
    """Sampling params as llama-server's generation_settings names them (/props shows the
    defaults the same way)."""
    return {"seed": p.seed if p.seed is not None else SEED_LIMIT, "temperature": p.temperature,
            "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "typical_p": p.typical_p,
            "repeat_last_n": p.repeat_last_n, "repeat_penalty": p.repeat_penalty,
            "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
            "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "top_n_sigma": -1.0,
            "n_predict": p.max_tokens, "max_tokens": p.max_tokens, "stop": list(p.stop),
            "ignore_eos": p.ignore_eos, "stream": False, "n_probs": 0,
            "grammar": p.grammar or "",
            "logit_bias": [[token, bias] for token, bias in p.logit_bias],
            "samplers": [name for name in SAMPLER_ORDER if name not in
                         ("dry", "top_n_sigma", "xtc")]}  # fmt: skip
