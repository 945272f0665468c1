"""Templates rendered in limited processes: hostile ones fail alone, quickly, and hurt nobody."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inference.gguf import CHATML_TEMPLATE, ChatTemplateError, read_gguf, render_chat
from inference.gguf.chat_template import MAX_RENDER_SECONDS
from inference.gguf.render_pool import RenderPool, RenderRequest, render_chat_isolated

CONVERSATION = [{"role": "user", "content": "Hi there"}]
# A generous bound: the pool kills at the 5 s cap plus a grace; this only catches "ran on".
FAILS_WITHIN = MAX_RENDER_SECONDS + 2.5

HOSTILE = {
    # 4 million strings sorted case-insensitively: one filter call, a lowered copy of each.
    "sort_4m_list": "{% set l = (range(100000)|map('string')|list) * 40 %}{{ l|sort|length }}",
    # Quadratic list concatenation inside one filter call: small values, a lot of time.
    "one_slow_filter": "{{ (range(100000)|batch(1)|list)|sum(start=[])|length }}",
    # Small lists nested into a value whose text is 10 GB, built by one |string.
    "nested_list": (
        "{% set a = ['xxxxxxxxxx'] * 1000 %}{% set b = [a] * 1000 %}{% set c = [b] * 1000 %}"
        "{{ c|string|length }}"
    ),
    # A list nested 40 times, stringified: 2**40 leaves.
    "nested_40_deep": (
        "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
        "{% endfor %}{{ ns.x|string|length }}"
    ),
    # A string at the size cap, joined 1000 times: 4 GB from one filter call.
    "huge_string": "{% set s = 'x' * 4000000 %}{{ ([s] * 1000)|join|length }}",
}


@pytest.fixture(scope="module")
def pool() -> Iterator[RenderPool]:
    pool = RenderPool(2)
    yield pool
    pool.close()


def render(pool: RenderPool, template: str | None, messages=CONVERSATION, **options) -> str:
    return pool.render(RenderRequest(template, messages, **options))


def test_a_render_in_the_pool_matches_the_in_process_one(pool: RenderPool) -> None:
    assert render(pool, None) == render_chat(None, CONVERSATION)
    template = "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"
    assert render(pool, template, bos_token="<s>") == "<s>user:Hi there"


def test_the_starter_models_template_renders_under_the_limits(
    pool: RenderPool, starter_model: Path
) -> None:
    template = read_gguf(starter_model).chat_template
    messages = [*CONVERSATION, {"role": "assistant", "content": "Hello!"}]
    assert render(pool, template, messages) == render_chat(template, messages)


def test_template_errors_come_back_as_chat_template_errors(pool: RenderPool) -> None:
    with pytest.raises(ChatTemplateError, match="Roles must alternate"):
        render(pool, "{{ raise_exception('Roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="compile"):
        render(pool, "{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="list of dicts"):
        render(pool, None, "hello")  # type: ignore[arg-type]
    assert render(pool, CHATML_TEMPLATE) == render_chat(None, CONVERSATION)


def test_a_conversation_that_is_not_plain_data_is_refused(pool: RenderPool) -> None:
    with pytest.raises(ChatTemplateError, match="JSON"):
        render(pool, None, [{"role": "user", "content": object()}])


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_fails_alone_within_the_cap(pool: RenderPool, name: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        render(pool, HOSTILE[name])
    assert time.monotonic() - start < FAILS_WITHIN
    assert render(pool, None) == render_chat(None, CONVERSATION)  # the pool still serves


def test_a_normal_render_beside_a_hostile_one_completes(pool: RenderPool) -> None:
    outcome: list[BaseException] = []

    def hostile() -> None:
        try:
            render(pool, HOSTILE["one_slow_filter"])
        except BaseException as e:  # noqa: BLE001 - recorded for the assert below
            outcome.append(e)

    thread = threading.Thread(target=hostile)
    thread.start()
    try:
        time.sleep(0.2)  # let the hostile render take a process first
        assert render(pool, None) == render_chat(None, CONVERSATION)
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ChatTemplateError)


def test_render_chat_isolated_uses_the_default_pool() -> None:
    assert render_chat_isolated(None, CONVERSATION) == render_chat(None, CONVERSATION)
    with pytest.raises(ChatTemplateError, match="not text"):
        render_chat_isolated(42, CONVERSATION)  # type: ignore[arg-type]


class _NoDefaultExecutor(ThreadPoolExecutor):
    """Stands in for the event loop's default thread pool: nobody may use it."""

    def submit(self, *args, **kwargs):
        raise AssertionError("the chat template render used the loop's default thread pool")


async def test_the_api_renders_outside_the_loops_default_thread_pool() -> None:
    import asyncio

    from dashboard.api.errors import ApiError
    from dashboard.api.prompts import chat_prompt
    from inference.models import LLMModel

    model = LLMModel(name="m", chat_template=CHATML_TEMPLATE, metadata={})
    loop = asyncio.get_running_loop()
    loop.set_default_executor(_NoDefaultExecutor(1))
    prompt = await chat_prompt(model, CONVERSATION, None)
    assert prompt.text == render_chat(CHATML_TEMPLATE, CONVERSATION)
    hostile = LLMModel(name="h", chat_template=HOSTILE["huge_string"], metadata={})
    with pytest.raises(ApiError) as refused:
        await chat_prompt(hostile, CONVERSATION, None)
    assert (refused.value.status, refused.value.code) == (400, "chat_template_error")
