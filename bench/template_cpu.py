"""Benchmark: the CPU time real chat templates need, against the render pool's CPU limits.

    python -m bench.template_cpu [--turns 50] [--templates DIR]

Renders, in this process, the starter model's template, the realistic templates of the tests
(tests/inference/thinking_templates.py) and every *.jinja file in --templates DIR (llama.cpp's
models/templates, for instance) over long conversations in four shapes: plain (a system prompt
and --turns exchanges of ~1 kB, the answers with <think> blocks), with ten tools and a tool call
in every third turn (arguments as a mapping, as the API passes them), the same without a system
prompt, and with a 1.8 MB document in the first message. A shape that a template refuses (its
own raise_exception, roles it does not take) is skipped for it.

For each template it prints the most CPU time of a cold render (compile + render, the first one
in a render process) and of a warm one (the compile cached), and at the end the worst cold
render as a share of IDLE_AFTER_CPU_SECONDS and CPU_SECONDS_PER_RENDER.
"""

import argparse
import statistics
import time
from pathlib import Path

from inference.catalog.starter import starter_model_path
from inference.gguf import chat_template, read_gguf
from inference.gguf.render_pool import CPU_SECONDS_PER_RENDER, IDLE_AFTER_CPU_SECONDS
from tests.inference import thinking_templates

TEXT = ("The quick brown fox jumps over the lazy dog; " * 25)[:1000]
TOOLS = [
    {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Does thing number {i} in the house.",
        "parameters": {"type": "object", "required": ["room", "level"], "properties": {
            "room": {"type": "string", "description": "the room", "enum": ["kitchen", "hall"]},
            "level": {"type": "integer", "description": "how much"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "tags"},
            "schedule": {"type": "object", "description": "when", "properties": {
                "start": {"type": "string"},
                "days": {"type": "array", "items": {"type": "integer"}},
            }},
        }},
    }}
    for i in range(10)
]  # fmt: skip


def plain(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant. " + TEXT[:400]}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: {TEXT}"})
        messages.append({"role": "assistant", "content": f"<think>\nHm {i}.\n</think>\n\n{TEXT}"})
    return [*messages, {"role": "user", "content": "And the last one?"}]


def with_tools(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant. " + TEXT[:400]}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: {TEXT}"})
        if i % 3 == 0:
            call = {
                "id": f"call{i:05d}",
                "type": "function",
                "function": {"name": "tool_1", "arguments": {"room": "kitchen", "level": i}},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": '{"ok": true}', "tool_call_id": call["id"],
                             "name": "tool_1"})  # fmt: skip
        messages.append({"role": "assistant", "content": f"Answer {i}: {TEXT}"})
    return [*messages, {"role": "user", "content": "And the last one?"}]


def shapes(turns: int) -> dict[str, tuple[list[dict], list | None]]:
    document = with_tools(turns)
    document[1] = {"role": "user", "content": "Summarise: " + "A long document line. " * 85_000}
    return {
        "plain": (plain(turns), None),
        "tools": (with_tools(turns), TOOLS),
        "no system": ([m for m in plain(turns) if m["role"] != "system"], None),
        "document": (document, TOOLS),
    }


def cpu_seconds(render) -> float:
    started = time.process_time()
    render()
    return time.process_time() - started


def measure(source: str, turns: int) -> tuple[float, float, list[str]] | None:
    """(the most CPU of a cold render, of a warm one, the shapes it took) or None if none."""
    cold = warm = 0.0
    taken = []
    for shape, (messages, tools) in shapes(turns).items():

        def render(messages=messages, tools=tools):
            return chat_template.render_chat(source, messages, bos_token="<s>",
                                             eos_token="</s>", tools=tools)  # fmt: skip

        chat_template._compile.cache_clear()
        try:
            first = cpu_seconds(render)
        except chat_template.ChatTemplateError:
            continue
        cold = max(cold, first)
        warm = max(warm, statistics.median(cpu_seconds(render) for _ in range(5)))
        taken.append(shape)
    return (cold, warm, taken) if taken else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--templates", type=Path, help="a folder of *.jinja chat templates")
    args = parser.parse_args()
    templates = {name.lower(): getattr(thinking_templates, name)
                 for name in ("QWEN3", "DEEPSEEK_R1", "FEW_SHOT")}  # fmt: skip
    templates["chatml"] = chat_template.CHATML_TEMPLATE
    if (starter := starter_model_path()) is not None:
        templates["starter model"] = read_gguf(starter).chat_template
    for path in sorted(args.templates.glob("*.jinja")) if args.templates else []:
        templates[path.stem] = path.read_text(encoding="utf-8")
    print(f"{len(templates)} templates, {args.turns} turns; CPU ms, the most over the shapes")
    worst = ("", 0.0)
    for name, source in templates.items():
        result = measure(source, args.turns)
        if result is None:
            print(f"  {name:55s} refused every shape")
            continue
        cold, warm, taken = result
        print(f"  {name:55s} cold {cold * 1000:6.1f}  warm {warm * 1000:6.1f}  "
              f"({', '.join(taken)})")  # fmt: skip
        worst = max(worst, (name, cold), key=lambda item: item[1])
    name, cold = worst
    print(f"worst cold render: {name}, {cold * 1000:.1f} ms = "
          f"{cold / IDLE_AFTER_CPU_SECONDS:.2f} of IDLE_AFTER_CPU_SECONDS, "
          f"{cold / CPU_SECONDS_PER_RENDER:.3f} of CPU_SECONDS_PER_RENDER")  # fmt: skip


if __name__ == "__main__":
    main()
