"""The rules every dialect's body follows, each stated once here and referred to by the
dialects' schemas (openai/, responses/, anthropic/, ollama/ each say only how their fields map
onto these):

1. Output formats: JSON output (any object, or one that validates against a schema) is held
   to a grammar (inference.text.structured); one raw grammar or one format, never both.
2. Thinking: a switch (True, False, a level) that reaches the template; "none" and "minimal"
   efforts turn it off, "xhigh" is "high"; and no thinking under a grammar, which would hold
   the thinking to it too: asking for both is a 400, and a constrained answer is rendered with
   thinking off.
3. Priority: a request may ask for background work (OpenAI's service_tier "flex"; any dialect's
   X-Appliance-Priority header, dashboard.api.auth), never for more than its key's.
4. Sampling: the engine's names (inference.engine.params), only what the body set, stop
   sequences as a tuple, log-probabilities as the engine's count.
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from dashboard.api.bodies import Content, JsonSchema, Strict
from inference.engine.generation import Priority
from inference.text.structured import json_object_grammar, schema_grammar
from inference.text.thinking import Think

# --- 1. output formats ------------------------------------------------------------------------

FormatName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


def format_grammar(schema: dict[str, Any] | None) -> str:
    """The grammar of JSON output: any JSON object without a schema (json_object, Ollama's
    "json"), else output that validates against it."""
    return json_object_grammar() if schema is None else schema_grammar(schema)


class OutputFormat(Strict):
    """text, json_object or json_schema: what OpenAI's response_format and the Responses API's
    text.format share (they only nest the schema differently)."""

    type: Literal["text", "json_object", "json_schema"] = "text"

    @property
    def constrains(self) -> bool:
        return self.type != "text"

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must validate against; None: any JSON object."""
        raise NotImplementedError

    def grammar(self) -> str | None:
        return format_grammar(self.output_schema()) if self.constrains else None


class SchemaFormat(Strict):
    """A json_schema format's own fields (OpenAI's `json_schema` object; the Responses API
    writes the same fields flat, beside `type`)."""

    description: Content | None = None
    schema_: Annotated[JsonSchema | None, Field(alias="schema")] = None  # none: any object
    # Accepted either way: the grammar always holds the output to the schema, and a schema
    # keyword it cannot enforce is a 400 with or without strict.
    strict: bool | None = None


def one_grammar(grammar: str | None, structured: object, other: str) -> str | None:
    """A raw grammar, refused beside a structured-output field (both would constrain)."""
    if grammar is not None and structured is not None:
        raise ValueError(f"send either grammar or {other}, not both")
    return grammar


# --- 2. thinking ------------------------------------------------------------------------------

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


def effort_switch(effort: Effort | None) -> Think:
    """A reasoning effort as the template's switch: "none" and "minimal" turn a thinking mode
    off (the least a switch can do), the levels turn it on and reach templates that read them
    (gpt-oss), "xhigh" as "high"; None leaves it to the template."""
    if effort in ("none", "minimal"):
        return False
    return "high" if effort == "xhigh" else effort


def thinks(think: Think) -> bool:
    """Whether a switch asks for thinking (None leaves it to the template, False turns it off)."""
    return think not in (None, False)


def no_thinking_under_a_grammar(think: Think, constrained: bool, *, switch: str,
                                constraint: str, off: str) -> None:  # fmt: skip
    """A 400 (ValueError in a validator) for thinking asked beside a grammar: it would hold the
    thinking to it too, and a block the prompt opened would fill with JSON. `switch`, the
    body's field; `constraint`, what constrains; `off`, what to send instead."""
    if thinks(think) and constrained:
        raise ValueError(f"{switch} cannot be combined with {constraint}: the grammar would "
                         f"hold the thinking to it too; send {off}")  # fmt: skip


def think_switch(think: Think, constrained: bool) -> Think:
    """The switch the template gets: off when a grammar constrains the output."""
    return False if constrained else think


# --- 3. priority ------------------------------------------------------------------------------

# OpenAI's processing tiers: "flex" (slower, cheaper there) asks for background priority here;
# the others are the key's own.
ServiceTier = Literal["auto", "default", "flex", "priority"]


def tier_priority(tier: ServiceTier | None) -> Priority:
    return "background" if tier == "flex" else "interactive"


# --- 4. sampling ------------------------------------------------------------------------------


def sampling(*, stop: list[str] | None = None, **values: Any) -> dict:
    """The engine's sampling params from a body's: the values it set (None: not set), and its
    stop sequences as a tuple when it has any."""
    params = {name: value for name, value in values.items() if value is not None}
    if stop:
        params["stop"] = tuple(stop)
    return params


def logprobs_asked(on: bool | None, top: int | None) -> int | None:
    """The engine's `logprobs` for a body's switch and top_logprobs: the sampled token's alone
    (0) unless more are asked; None when the switch is off."""
    return (top or 0) if on else None



def logit_bias_pairs(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...] | None:
    """A body's logit_bias (token id as text → bias) as the engine's (token id, bias) pairs."""
    return tuple((int(token), value) for token, value in bias.items()) if bias else None
