"""llama-server's own sampling and stopping fields (tools/server/server-schema.cpp), as /infill
takes them, and as /completion can: `LlamaSampling` is the body's part, `sampling()` its values
in the engine's names, and `Limits` what the route itself enforces while it reads the answer
(n_predict 0, t_max_prompt_ms, t_max_predict_ms, n_indent: dashboard.api.llama_server.limits).

Every number is bounded as llama-server bounds it, or tighter where the engine is (a 400 names
the field). Fields llama-server takes and the engine has no use for are accepted and named here
with the reason; any other field is refused (Strict).
"""

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from dashboard.api import rules
from dashboard.api.bodies import (
    GrammarText,
    ModelName,
    Penalty,
    RepeatLastN,
    RepeatPenalty,
    Stop,
    Strict,
    TopK,
    Unit,
)
from inference.engine.params import MAX_TOKENS_LIMIT, SEED_LIMIT

# llama-server's sampler names (common/sampling.cpp, common_sampler_types_from_names). The
# engine's chain is fixed (penalties, top-k, top-p, min-p, temperature); the list is accepted
# so that llama.vscode's ["top_k", "top_p", "infill"] works, but neither its order nor the
# samplers the engine lacks (dry, typ_p, xtc, top_n_sigma, infill) apply.
SamplerName = Literal["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "typical_p",
                      "top_p", "min_p", "xtc", "temperature", "infill"]  # fmt: skip
MAX_MS = 24 * 3600 * 1000  # a day: any time limit past it is none
# The longest response_fields entry (llama.vscode's: "timings/predicted_per_token_ms").
MAX_FIELD_CHARS = 64


class LlamaSampling(Strict):
    """The sampling and stopping fields /infill and /completion share."""

    model: ModelName = ""
    stream: bool = False
    # -1: until the context is full (the engine's own bound); 0: read the prompt into the cache
    # and answer nothing (an editor's warm-up).
    n_predict: Annotated[int, Field(ge=-1, le=MAX_TOKENS_LIMIT)] | None = None
    max_tokens: Annotated[int, Field(ge=-1, le=MAX_TOKENS_LIMIT)] | None = None  # its alias
    temperature: Annotated[float, Field(ge=0.0, le=5.0)] | None = None
    top_k: TopK | None = None
    top_p: Unit | None = None
    min_p: Unit | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: RepeatLastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Field(ge=-1, le=SEED_LIMIT)] | None = None  # -1: a random one
    stop: Stop = None
    grammar: GrammarText | None = None  # GBNF: only what it allows is sampled
    samplers: Annotated[list[SamplerName], Field(max_length=16)] | None = None
    # The engine reuses a cached prefix whenever it can (within the caller's partition).
    cache_prompt: bool = True
    t_max_prompt_ms: Annotated[int, Field(ge=-1, le=MAX_MS)] | None = None
    t_max_predict_ms: Annotated[int, Field(ge=-1, le=MAX_MS)] | None = None
    n_indent: Annotated[int, Field(ge=0, le=1 << 16)] | None = None
    response_fields: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_FIELD_CHARS)]],
        Field(max_length=64),
    ] | None = None  # fmt: skip

    @property
    def predict(self) -> int:
        """n_predict (or its alias), -1 when neither is set."""
        for value in (self.n_predict, self.max_tokens):
            if value is not None:
                return value
        return -1

    def sampling(self) -> dict:
        """The engine's sampling params (n_predict -1: the most the context holds; 0: one
        token, which the route does not send)."""
        predict = self.predict
        return rules.sampling(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            seed=None if self.seed in (None, -1) else self.seed, stop=self.stop,
            grammar=self.grammar, max_tokens=MAX_TOKENS_LIMIT if predict < 0 else max(predict, 1),
        )  # fmt: skip

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
