"""Render a model's chat template (tokenizer.chat_template) the way Hugging Face does, safely.

A template comes from a GGUF file, i.e. from whoever made the file, so it runs only inside
Jinja's ImmutableSandboxedEnvironment, with more guards on top of the sandbox:

- reaching for an unsafe attribute (`''.__class__`, `cycler.__init__`) is an error, not a
  silent empty string;
- operators and calls that can build huge values (`'a' * n`, `n ** m`, `'%9999999d' % x`,
  `.ljust(n)`, `|center(n)`, `~` chains) are checked before or right after they run, so no
  value grows past the output cap;
- every loop iteration, call and operator spends from a per-render step budget with a
  wall-clock deadline, so a template cannot spin for ever;
- the source and the rendered output are capped.
Anything that goes wrong, in Jinja or in Python, becomes a ChatTemplateError.

The step budget cannot interrupt one long filter call nor bound what one call allocates, so the
web process renders through inference.gguf.render_pool: render_chat runs there in a separate
process with address-space, CPU and wall-clock limits, killed and replaced when it breaks them.

HF compatibility: trim_blocks and lstrip_blocks, the loopcontrols extension, a no-op
`{% generation %}` tag, a `tojson` that keeps non-ASCII text, `raise_exception` and
`strftime_now`; variables messages, tools, add_generation_prompt, bos_token, eos_token, and
the thinking switches enable_thinking (Qwen3) and reasoning_effort (gpt-oss), which are left
undefined unless the request sets them, so that a template's `is defined` default holds.
"""

from __future__ import annotations

import functools
import json
import re
import string
import time
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The chat template could not be compiled or rendered; the message says why."""


MAX_TEMPLATE_CHARS = 256 * 1024  # real templates are 1-20 kB
MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # ~1M tokens: more than any context window we load
MAX_VALUE_CHARS = MAX_OUTPUT_CHARS  # any single string or list built while rendering
MAX_WIDTH = 100_000  # widths and counts a template may ask filters and str methods for
MAX_INT_BITS = 4096  # templates count tokens and turns, not RSA keys
MAX_STEPS = 5_000_000  # loop iterations + calls + operators per render
MAX_RENDER_SECONDS = 5.0

# A template for models without one (ChatML, what SmolLM2 and Qwen use).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' ~ message['role'] ~ '\n' ~ (message['content'] or '') ~ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """Render a conversation to a prompt with `template` (ChatML when None or empty)."""
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"the chat template is a {type(template).__name__}, not text")
    compiled = _compile(template or CHATML_TEMPLATE)
    variables = {
        "messages": _plain_messages(messages),
        "tools": tools,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    switches = {"enable_thinking": enable_thinking, "reasoning_effort": reasoning_effort}
    variables.update({name: value for name, value in switches.items() if value is not None})
    token = _BUDGET.set(_Budget(MAX_STEPS, time.monotonic() + MAX_RENDER_SECONDS))
    try:
        return _render(compiled, variables)
    except ChatTemplateError:
        raise
    except _TemplateRaised as e:
        raise ChatTemplateError(f"the chat template refused the conversation: {e}") from None
    except SecurityError as e:
        raise ChatTemplateError(f"the chat template did something unsafe: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory") from None
    except Exception as e:  # TemplateError, UndefinedError, TypeError from template code...
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _BUDGET.reset(token)


def _render(compiled: Any, variables: dict[str, Any]) -> str:
    # Streamed, so that a template printing in a loop is stopped at the cap, not after it.
    chunks: list[str] = []
    size = 0
    for chunk in compiled.generate(**variables):
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise ChatTemplateError(
                f"the rendered prompt is over the {MAX_OUTPUT_CHARS}-character limit"
            )
        chunks.append(chunk)
    return "".join(chunks)


def _plain_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise ChatTemplateError("messages must be a list of dicts")
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message #{i} has no role")
    return [dict(m) for m in messages]


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(
            f"the chat template is {len(source)} characters, over the {MAX_TEMPLATE_CHARS} limit"
        )
    try:
        return _ENV.from_string(source)
    except Exception as e:  # TemplateSyntaxError, and anything a hostile source provokes
        raise ChatTemplateError(f"the chat template does not compile: {e}") from None


# 1. The per-render budget.


@dataclass(slots=True)
class _Budget:
    steps_left: int
    deadline: float


_BUDGET: ContextVar[_Budget | None] = ContextVar("chat_template_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is None:  # compile-time constant folding: bounded by the source size
        return
    budget.steps_left -= 1
    if budget.steps_left < 0:
        raise ChatTemplateError(f"the chat template ran more than {MAX_STEPS} steps")
    if budget.steps_left % 4096 == 0 and time.monotonic() > budget.deadline:
        raise ChatTemplateError(f"the chat template ran longer than {MAX_RENDER_SECONDS} s")


def _guard_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    for item in iterable:
        _tick()
        yield item


# 2. Size checks.


def _check_size(value: Any) -> Any:
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_VALUE_CHARS:
        raise ChatTemplateError(f"the chat template built a value over {MAX_VALUE_CHARS} long")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ChatTemplateError(f"the chat template built an integer over {MAX_INT_BITS} bits")
    return value


# A %-format spec's width and precision, after an optional (key); `*` takes them from the
# arguments, so it is refused.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_NUMBER = re.compile(r"\d+")


def _check_percent_format(fmt: str) -> None:
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for n in (width, precision):
            if n == "*" or (n and int(n) > MAX_WIDTH):
                raise ChatTemplateError(f"the chat template used a %-format width of {n}")


def _check_brace_format(fmt: str) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise ChatTemplateError(f"the chat template used a bad format string: {e}") from None
    for _, _, spec, _ in fields:
        if spec and ("{" in spec or any(int(n) > MAX_WIDTH for n in _FORMAT_NUMBER.findall(spec))):
            raise ChatTemplateError(f"the chat template used a format spec {spec!r}")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int):
                if len(seq) * max(n, 0) > MAX_VALUE_CHARS:
                    raise ChatTemplateError("the chat template repeated a value too many times")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if right > 0 and max(left.bit_length(), 1) * right > MAX_INT_BITS:
            raise ChatTemplateError(f"the chat template computed {left} ** {right}")
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(left)


# str methods whose result can be far larger than the string: name -> estimate of the result.
def _str_method_estimate(s: str, name: str, args: tuple[Any, ...]) -> int:
    ints = [a for a in args if isinstance(a, int)]
    if name in ("center", "ljust", "rjust", "zfill"):
        return max([len(s), *ints])
    if name == "expandtabs":
        return len(s) * max([1, *ints])
    if name == "replace" and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        return len(s) + (len(s) // max(len(old), 1) + 1) * len(new)
    return 0


# 3. The environment.


class _GuardedCodeGenerator(CodeGenerator):
    """Routes every for-loop's iterable and every `~` concatenation through the guards."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        guard = nodes.EnvironmentAttribute("guard_iter", lineno=node.lineno)
        node.iter = nodes.Call(guard, [node.iter], [], None, None, lineno=node.lineno)
        node.iter.set_environment(self.environment)
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.guarded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _TemplateRaised(Exception):
    """raise_exception() from the template: it refuses this conversation (wrong roles...)."""


class _GenerationTag(Extension):
    """HF's `{% generation %}` marks assistant text for training masks: render the body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return _guard_iter(iterable)

    def guarded_concat(self, parts: tuple[Any, ...]) -> str:
        _tick()
        texts = [str(p) for p in parts]
        if sum(len(t) for t in texts) > MAX_VALUE_CHARS:
            raise ChatTemplateError(f"the chat template built a string over {MAX_VALUE_CHARS}")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _check_binop(operator, left, right)
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            if _str_method_estimate(owner, getattr(__obj, "__name__", ""), args) > MAX_VALUE_CHARS:
                raise ChatTemplateError("the chat template asked a string method for too much")
        return _check_size(super().call(__context, __obj, *args, **kwargs))

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # The stock sandbox returns an Undefined that prints as ''; a template that reaches for
        # internals is hostile, so stop it.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object")

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_brace_format(value.__self__)
        return wrapped


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    if isinstance(indent, int) and indent > 64:
        raise ChatTemplateError(f"the chat template asked tojson for an indent of {indent}")
    return _check_size(
        json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )
    )


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# Filters whose numeric arguments are widths or counts of things to build.
_SIZED_FILTERS = {"center", "indent", "wordwrap", "truncate", "slice", "batch"}


def _filter_estimate(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How long a filter's string result could be, for the filters that can grow a string."""
    if not args or not isinstance(args[0], str):
        return 0
    s = args[0]

    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "format":
        _check_percent_format(s)
    elif name == "replace":
        return _str_method_estimate(s, "replace", (arg(1, "old", ""), arg(2, "new", "")))
    elif name == "indent":
        width = arg(1, "width", 4)
        per_line = width if isinstance(width, int) else len(str(width))
        return len(s) + per_line * (s.count("\n") + 1)
    return 0


def _guard_filter(name: str, f: Any) -> Any:
    """Refuses huge widths, counts and results before the filter builds them."""
    takes_context = getattr(f, "jinja_pass_arg", None) is not None

    @functools.wraps(f)  # keeps jinja_pass_arg (pass_context and friends)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        user_args = args[1:] if takes_context else args
        if name in _SIZED_FILTERS:
            for a in (*user_args[1:], *kwargs.values()):
                if isinstance(a, int) and a > MAX_WIDTH:
                    raise ChatTemplateError(f"the chat template asked |{name} for {a}")
        if _filter_estimate(name, user_args, kwargs) > MAX_VALUE_CHARS:
            raise ChatTemplateError(f"the chat template asked |{name} for too much")
        return _check_size(f(*args, **kwargs))

    return guarded


def _make_env() -> _ChatSandbox:
    env = _ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
    )
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.filters["tojson"] = _guard_filter("tojson", _tojson)
    env.globals.pop("lipsum", None)  # generates text of any size on request
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_env()
