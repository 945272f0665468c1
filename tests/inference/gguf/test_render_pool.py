"""Templates rendered in limited processes: hostile ones fail alone, quickly, and hurt nobody."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from inference.gguf import CHATML_TEMPLATE, ChatTemplateError, read_gguf, render_chat
from inference.gguf import render_pool as render_pool_module
from inference.gguf.chat_template import MAX_RENDER_SECONDS
from inference.gguf.render_pool import (
    CPU_SECONDS_PER_RENDER,
    RETIRE_RSS_BYTES,
    RenderLimits,
    RenderPool,
    RenderRequest,
    render_chat_isolated,
)
from tests.inference.text.thinking_templates import DEEPSEEK_R1, FEW_SHOT, QWEN3

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


REAL_TEMPLATES = {"qwen3": QWEN3, "deepseek_r1": DEEPSEEK_R1, "few_shot": FEW_SHOT,
                  "chatml": CHATML_TEMPLATE}  # fmt: skip


TOOLS = [
    {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Does thing {i}.",
        "parameters": {"type": "object", "required": ["room"], "properties": {
            "room": {"type": "string", "enum": ["kitchen", "hall"]}, "level": {"type": "integer"},
            "days": {"type": "array", "items": {"type": "integer"}}}},
    }}
    for i in range(10)
]  # fmt: skip


def long_conversation(turns: int = 50) -> list[dict]:
    """A system prompt, then `turns` exchanges of ~1 kB each, every third with a tool call."""
    text = "The quick brown fox jumps over the lazy dog. " * 22
    messages = [{"role": "system", "content": "You help around the house."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: {text}"})
        if i % 3 == 0:
            call = {"id": f"call_{i}", "type": "function",
                    "function": {"name": "tool_1", "arguments": {"room": "kitchen"}}}  # fmt: skip
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": '{"ok": true}', "tool_call_id": call["id"]})
        messages.append({"role": "assistant", "content": f"<think>\nHm.\n</think>\n\n{text}"})
    return [*messages, {"role": "user", "content": "And the last one?"}]


@pytest.fixture(scope="module")
def pool() -> Iterator[RenderPool]:
    pool = RenderPool(2)
    yield pool
    pool.close()


def render(pool: RenderPool, template: str | None, messages=CONVERSATION, **options) -> str:
    return pool.render(RenderRequest(template, messages, **options))


def render_processes() -> set[int]:
    """The pids of this test process's render processes, of every pool."""
    return {
        child.pid
        for child in psutil.Process().children()
        if "inference.gguf.render_pool" in " ".join(child.cmdline())
    }


def started_by(action: Callable[[], object]) -> set[int]:
    """The render processes that `action` started (and that are still running)."""
    before = render_processes()
    action()
    return render_processes() - before


def ends(pid: int) -> bool:
    """Whether process `pid` ends within a minute (one at the lowest priority, killed, exits at
    that priority: on a busy machine that takes a while)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def lowest_priority(pid: int) -> bool:
    """nice 19, and where Linux has them SCHED_IDLE and an autogroup ("/autogroup-7 nice 19")."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    try:
        idle = not hasattr(os, "sched_getscheduler") or os.sched_getscheduler(pid) == os.SCHED_IDLE
        group = not autogroup.exists() or autogroup.read_text().split()[-1] == "19"
        return idle and group and os.getpriority(os.PRIO_PROCESS, pid) == 19
    except OSError:  # it has ended
        return False


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


@pytest.mark.parametrize("name", sorted(REAL_TEMPLATES))
def test_real_templates_render_long_conversations_at_normal_priority(name: str) -> None:
    template = REAL_TEMPLATES[name]
    messages = long_conversation()
    pool = RenderPool(1)
    try:
        (pid,) = started_by(lambda: render(pool, template, messages, tools=TOOLS))
        for _ in range(3):
            assert render(pool, template, messages, tools=TOOLS) == render_chat(
                template, messages, tools=TOOLS
            )
        # Well inside the CPU allowance: the same process served them all, at normal priority.
        assert pid in render_processes()
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
        if hasattr(os, "sched_getscheduler"):
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
    finally:
        pool.close()


def test_a_render_process_is_kept_while_the_web_process_is_large() -> None:
    # The child's ru_maxrss starts at the parent's peak (fork and exec keep it): that must not
    # count as the render process having grown large.
    ballast = b"x" * (RETIRE_RSS_BYTES + 64 * 1024 * 1024)
    pool = RenderPool(1)
    try:
        (pid,) = started_by(lambda: render(pool, None))
        assert render(pool, None) == render_chat(None, CONVERSATION)
        assert pid in render_processes()
    finally:
        pool.close()
        del ballast


def test_the_starter_models_template_renders_a_long_conversation_with_tools(
    pool: RenderPool, starter_model: Path
) -> None:
    template = read_gguf(starter_model).chat_template
    messages = long_conversation()
    expected = render_chat(template, messages, tools=TOOLS)
    assert render(pool, template, messages, tools=TOOLS) == expected


def test_a_cpu_burning_template_is_stopped_by_the_cpu_cap() -> None:
    # Long wall-clock limits, so that only the CPU cap can stop it even on a busy machine (at
    # full priority: a render at the lowest one may get no CPU at all there).
    limits = RenderLimits(wall_seconds=120, idle_after_cpu_seconds=120)
    capped = RenderPool(1, limits)
    try:
        with pytest.raises(ChatTemplateError) as stopped:
            render(capped, HOSTILE["one_slow_filter"])
        assert f"more than {CPU_SECONDS_PER_RENDER:g} s of CPU time" in str(stopped.value)
        assert render(capped, None) == render_chat(None, CONVERSATION)  # a fresh process serves
    finally:
        capped.close()


def test_a_render_that_runs_long_is_moved_to_the_lowest_priority() -> None:
    slow = RenderPool(1)
    try:
        (pid,) = started_by(lambda: render(slow, None))  # it starts at normal priority
        outcome: list[BaseException] = []

        def hostile() -> None:
            try:
                render(slow, HOSTILE["one_slow_filter"])
            except BaseException as e:  # noqa: BLE001 - recorded for the assert below
                outcome.append(e)

        assert not lowest_priority(pid)
        thread = threading.Thread(target=hostile)
        thread.start()
        lowered = False
        while thread.is_alive() and not lowered:
            lowered = lowest_priority(pid)
            time.sleep(0.01)
        thread.join(timeout=30)
        assert lowered
        assert len(outcome) == 1 and isinstance(outcome[0], ChatTemplateError)
        assert ends(pid)  # killed: a fresh one serves the next render
        assert render(slow, None) == render_chat(None, CONVERSATION)
    finally:
        slow.close()


def test_a_lowered_render_gives_its_place_to_the_next_request() -> None:
    # One place; the hostile render may run on for 5 s of CPU at the lowest priority (or 30 s,
    # on a machine too busy to give it that).
    pool = RenderPool(1, RenderLimits(wall_seconds=30, cpu_seconds=5))
    try:
        (pid,) = started_by(lambda: render(pool, None))
        outcome: list[BaseException] = []

        def hostile() -> None:
            try:
                render(pool, HOSTILE["one_slow_filter"])
            except BaseException as e:  # noqa: BLE001 - recorded for the assert below
                outcome.append(e)

        thread = threading.Thread(target=hostile)
        thread.start()
        while thread.is_alive() and not lowest_priority(pid):
            time.sleep(0.01)
        # A fresh process serves this one while the lowered render still runs.
        assert render(pool, None) == render_chat(None, CONVERSATION)
        assert thread.is_alive()
        thread.join(timeout=60)
        assert len(outcome) == 1 and isinstance(outcome[0], ChatTemplateError)
        assert ends(pid)
    finally:
        pool.close()


def test_a_process_moved_to_the_lowest_priority_is_replaced_after_its_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lowered: list[int] = []
    monkeypatch.setattr(render_pool_module, "_lower_priority", lowered.append)
    eager = RenderPool(1, RenderLimits(idle_after_cpu_seconds=0.05))
    busy = (
        "{% for i in range(30000) %}{% for j in range(3) %}{% endfor %}{% endfor %}done"  # ~0.3 s
    )
    try:
        (first,) = started_by(lambda: render(eager, None))
        assert render(eager, busy) == "done"  # it finishes: lowering a render does not fail it
        assert lowered == [first]
        assert ends(first)
        (second,) = started_by(lambda: render(eager, None))
        assert second != first
    finally:
        eager.close()


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
    from dashboard.api.templating import chat_prompt
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
