"""llama-server's /completion: a prompt sent as is (text, token ids, or both mixed), its
sampling fields, and its answer shapes, through the answer pipeline (dashboard.api.pipeline).

The body is llama-server's (tools/server/server-schema.cpp): `n_predict` (or `max_tokens`),
the sampling knobs by their llama-server names, `ignore_eos`, `logit_bias`, `grammar` or
`json_schema`, and `samplers`, the order of the sampler chain. Its chain here is fixed (penalties,
top_k, typical_p, top_p, min_p, temperature, as llama-server's default order), so `samplers` may
leave samplers out (turning them off) but not reorder them. A field llama-server has and this
engine cannot honour (mirostat, DRY, XTC, ... away from their off values) is a 400 naming it.

A text prompt is tokenized as llama-server does: the BOS token added where the vocabulary adds
one, special tokens written in the text parsed. In a list, token ids go as they are and strings are
tokenized in place, the BOS token only before a first string (llama-server's tokenize_mixed).

Streamed (`stream: true`), each piece of text is a `data: {...}` line with `stop: false`, and the
last line is the final object with `stop: true` and empty content; no [DONE] follows, as in
llama-server. Not streamed, the answer is that final object with the whole content.
"""

from typing import Annotated, Any

from django.http import HttpRequest
from pydantic import AliasChoices, BeforeValidator, Field, ValidationInfo, field_validator

from dashboard.api import pipeline, rules
from dashboard.api.answer_parser import Piece
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import (
    GrammarText,
    JsonSchema,
    ModelName,
    Penalty,
    PromptText,
    RepeatLastN,
    RepeatPenalty,
    Stop,
    Strict,
    TopK,
    Unit,
    parse_body,
    refuse_if,
)
from dashboard.api.errors import ApiError, from_event
from dashboard.api.figures import timings
from dashboard.api.pipeline import Answer, Ask, Ending
from dashboard.api.streaming import sse
from dashboard.api.templating import ChatPrompt
from inference.catalog.specs import spec_for
from inference.engine.params import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS,
    MAX_TOKENS_LIMIT,
    SEED_LIMIT,
    TOKEN_ID_LIMIT,
    SamplingParams,
)
from inference.engine.tokens import MAX_TOKENS
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.tokens import TokenError
from inference.text.prompting import Prompt

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

TokenId = Annotated[int, Field(ge=0, lt=TOKEN_ID_LIMIT)]


def _one_prompt(value: Any) -> Any:
    """llama-server's prompt forms that are one prompt: text, a list of token ids and strings
    (with at least one id), or a list of one string. A list of several strings is several
    prompts, a batch, which it answers with an array: refused here."""
    if isinstance(value, list):
        if not value:
            raise ValueError("the prompt is empty")
        if len(value) > MAX_TOKENS:
            raise ValueError(f"at most {MAX_TOKENS} items, got {len(value)}")
        numbers = any(isinstance(item, int) and not isinstance(item, bool) for item in value)
        if not numbers and len(value) > 1:
            raise ValueError("one prompt per request: a list of several strings is a batch, "
                             "which is not supported; send them one at a time")  # fmt: skip
        if not numbers:
            return value[0]
    return value


def _sampler_names(value: Any) -> Any:
    if isinstance(value, list):
        return [SAMPLER_ALIASES.get(name, name) if isinstance(name, str) else name
                for name in value]  # fmt: skip
    return value


def _in_order(names: list[str]) -> list[str]:
    unknown = [name for name in names if name not in SAMPLER_ORDER]
    if unknown:
        raise ValueError(f"unknown sampler {unknown[0]!r}; known: {', '.join(SAMPLER_ORDER)}")
    at = [SAMPLER_ORDER.index(name) for name in names]
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
    BeforeValidator(_bias_pairs, json_schema_input_type=list[tuple[TokenId, float | bool]] |
                    dict[str, float | bool]),
]


def _off_unless(default: Any, name: str):
    return refuse_if(lambda v: v != default, f"{name} is not supported by this engine (only its "
                     f"off value, {default})")  # fmt: skip


class LlamaCompletionRequest(Strict):
    """llama-server's /completion body (a `model` field besides, for a box with many)."""

    model: ModelName = ""
    prompt: Annotated[
        PromptText | list[TokenId | PromptText],
        BeforeValidator(_one_prompt,
                        json_schema_input_type=PromptText | list[TokenId | PromptText]),
    ]
    n_predict: Annotated[int, Field(ge=-1, le=MAX_TOKENS_LIMIT),
                         Field(validation_alias=AliasChoices("n_predict", "max_tokens")),
                         refuse_if(lambda v: v == 0, "n_predict 0 (evaluate the prompt only) is "
                                   "not supported: ask for at least one token")] = -1  # fmt: skip
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
    grammar: GrammarText | None = None
    json_schema: JsonSchema | None = None
    samplers: Annotated[list[str], Field(max_length=len(SAMPLER_ORDER)),
                        BeforeValidator(_sampler_names)] | None = None  # fmt: skip
    stream: bool = False
    cache_prompt: bool = True  # the prefix cache is always on; reuse never changes an answer
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

    def sampling(self) -> dict:
        grammar = rules.format_grammar(self.json_schema) if self.json_schema is not None else None
        params = rules.sampling(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            typical_p=self.typical_p, repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=None if self.seed == -1 else self.seed,
            max_tokens=None if self.n_predict == -1 else self.n_predict, stop=self.stop,
            grammar=self.grammar or grammar, ignore_eos=self.ignore_eos or None,
            logit_bias=self.logit_bias or None,
        )  # fmt: skip
        for name in SAMPLER_OFF if self.samplers is not None else ():
            if name not in self.samplers:
                params.update(SAMPLER_OFF[name])
        return params

    def ask(self) -> Ask:
        return Ask(model=self.model, sampling=self.sampling())


def stop_type(end: Ending) -> str:
    """llama-server's stop_type: eos, word (a stop string), limit (n_predict), none."""
    if end.finish_reason == "length":
        return "limit"
    if end.finish_reason == "stop":
        return "word" if end.stop else "eos"
    return "none"


def server_timings(figures: dict) -> dict:
    """llama-server's timings object (the appliance's other figures beside it)."""
    out = timings(figures)
    for phase, n in (("prompt", "prompt_n"), ("predicted", "predicted_n")):
        ms = out[f"{phase}_ms"]
        out[f"{phase}_per_token_ms"] = ms / out[n] if ms is not None and out[n] else None
    return out


async def prompt_tokens(model: LLMModel, prompt: list) -> tuple[int, ...]:
    """A mixed prompt's token ids: strings tokenized in place (the BOS token only before a first
    string, as llama-server's tokenize_mixed), ids checked against the vocabulary."""
    ids: list[int] = []
    for at, item in enumerate(prompt):
        if isinstance(item, str):
            ids += (await pipeline.tokenize_text(model, item, add_special=at == 0)).tokens
        else:
            ids.append(item)
    if len(ids) > MAX_TOKENS:
        raise ApiError(400, f"prompt: at most {MAX_TOKENS} tokens, got {len(ids)}",
                       param="prompt", code="invalid_value")  # fmt: skip
    try:  # the runner's tokenizer knows the vocabulary's size: an id past it is a 400
        await get_client().detokenize(spec_for(model), ids)
    except TokenError as exc:
        error = from_event(exc.event)
        raise ApiError(error.status, f"prompt: {error.message}", param="prompt",
                       code=error.code) from None  # fmt: skip
    return tuple(ids)


async def rendered(model: LLMModel, body: LlamaCompletionRequest) -> ChatPrompt:
    """The prompt as sent, no template: text tokenized by the runner, or token ids (which the
    request carries as they are: GenerationRequest's prompt is text or ids)."""
    if isinstance(body.prompt, str):
        return ChatPrompt(Prompt(body.prompt, add_special=True), None)
    return ChatPrompt(Prompt(await prompt_tokens(model, body.prompt), add_special=False), None)


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


class CompletionWriter:
    content_type = "text/event-stream"

    def __init__(self, answer: Answer, body: LlamaCompletionRequest):
        self.answer = answer
        self.model_name = answer.name
        self.prompt = body.prompt if isinstance(body.prompt, str) else ""
        self.params = answer.run.request.params

    def _partial(self, content: str) -> dict:
        run = self.answer.run
        return {"index": 0, "content": content, "tokens": [], "stop": False, "id_slot": 0,
                "tokens_predicted": run.output_tokens,
                "tokens_evaluated": run.prompt_tokens or 0}  # fmt: skip

    def _final(self, end: Ending, content: str, streamed: bool) -> dict:
        figures = end.figures
        prompt_n = figures.get("prompt_tokens") or 0
        # llama-server counts the end-of-generation token it sampled as predicted; the engine
        # samples it too but does not output it (bench/completion.py compares the counts).
        output = figures.get("output_tokens") or 0
        predicted = output + (stop_type(end) == "eos")
        return {"index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True,
                "model": self.model_name, "tokens_predicted": predicted,
                "tokens_evaluated": prompt_n,
                "generation_settings": {**settings_json(self.params), "stream": streamed},
                "prompt": self.prompt, "has_new_line": "\n" in content, "truncated": False,
                "stop_type": stop_type(end), "stopping_word": end.stop or "",
                "tokens_cached": prompt_n + output,  # what the sequence holds now
                "timings": server_timings(figures)}  # fmt: skip

    def opening(self) -> list[bytes]:
        return []

    def piece(self, piece: Piece) -> list[bytes]:
        return [sse(self._partial(piece.content))] if piece.content else []

    def ending(self, end: Ending) -> list[bytes]:
        return [*self.piece(end.text), sse(self._final(end, "", streamed=True))]

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse(error.body("openai"))]

    def final(self, end: Ending) -> dict:
        return self._final(end, end.text.content, streamed=False)


@api_endpoint(dialect="openai", methods=("POST",))
async def completion(request: HttpRequest):
    body = parse_body(request, LlamaCompletionRequest)
    ask = body.ask()
    model = await pipeline.resolve_model(ask.model)
    prompt = await rendered(model, body)
    [answer] = await pipeline.launch(request, model, ask, prompt, source="llama-server")
    return await pipeline.respond(answer, CompletionWriter(answer, body), streamed=body.stream)


__all__ = ["completion"]
