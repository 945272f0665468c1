"""Chat templates with a thinking mode, for the thinking tests: the parts of Qwen3's and
DeepSeek-R1's own templates that decide thinking, and a few-shot template that makes the small
starter model write a <think> block (see FEW_SHOT)."""

# Qwen3 (hybrid): thinks unless enable_thinking is false, which writes an empty block; earlier
# turns' thinking comes from reasoning_content.
QWEN3 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content is string %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# DeepSeek-R1 (0528 and the distills): the generation prompt opens the block; no switch.
DEEPSEEK_R1 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<｜User｜>' + message.content }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<｜Assistant｜>' + message.content.split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)

_HI = (
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user greets me. I greet back.\n</think>\n\n"
    "Hello! Nice to meet you.<|im_end|>\n"
)
_WEATHER = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user wants the weather. I call the tool.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    "<|im_end|>\n"
)

# A thinking-variant template (like Qwen3-2507-Thinking, whose generation prompt opens the
# block) with a switch, for SmolLM2-135M: it never learned <think> blocks, so the template shows
# it a few earlier turns that have one, and the model, answering greedily, continues the
# pattern. With tools it shows tool calls after the thinking instead.
FEW_SHOT = (
    (
        "{{- '<|im_start|>system\\nYou think first, then answer.' }}"
        "{%- if tools %}{{- ' Tools:' }}{%- for t in tools %}{{- ' ' + t.function.name }}"
        "{%- endfor %}{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- for i in range(4) %}{{- (_WEATHER if tools else _HI) }}{%- endfor %}"
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}"
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- else %}{{- '<think>\\n' }}{%- endif %}"
        "{%- endif %}"
    )
    .replace("_WEATHER", repr(_WEATHER))
    .replace("_HI", repr(_HI))
)
