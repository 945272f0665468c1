"""Thinking from a GGUF file's own template to the prompt: detected at import, switched by the
request, refused for a model that cannot think (but think: false is fine for any model)."""

import pytest

from dashboard.api.errors import ApiError
from dashboard.api.ollama.shapes import show
from dashboard.api.templating import _render, raw_prompt
from inference.catalog.importing import register_file
from inference.models import LLMModel
from inference.text.thinking import thinking_mode
from tests.inference.ggufs import tiny_gguf
from tests.inference.text.thinking_templates import DEEPSEEK_R1, QWEN3

pytestmark = pytest.mark.django_db

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def imported(settings, tmp_path):
    """import(name, template): a tiny GGUF carrying `template`, registered as a scan finds it."""
    settings.MODELS_DIR = tmp_path

    def register(name: str, template: str) -> LLMModel:
        path = tiny_gguf(tmp_path / f"{name}.gguf", chat_template=template)
        return register_file(path, source=LLMModel.Source.SCAN, name=name, hash_file=False)

    return register


def test_a_qwen3_gguf_is_a_thinking_model_from_its_own_metadata(imported):
    model = imported("qwen3-tiny", QWEN3)
    model.refresh_from_db()
    assert model.chat_template == QWEN3  # read from the file, no override
    assert thinking_mode(model.effective_chat_template)
    assert "thinking" in show(model)["capabilities"]
    plain = imported("plain-tiny", "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert "thinking" not in show(plain)["capabilities"]


def test_think_false_reaches_a_qwen3_template_as_enable_thinking(imported):
    model = imported("qwen3-tiny", QWEN3)
    off = _render(model, HI, None, think=False)
    on = _render(model, HI, None, think=True)
    default = _render(model, HI, None)
    assert off.text == on.text + "<think>\n\n</think>\n\n"
    assert default.text == on.text
    # The answers of a thinking model are split whatever the switch; the model writes the
    # opening tag itself here.
    assert off.thinking and on.thinking and default.thinking
    assert not on.opens_thinking and not off.opens_thinking


def test_a_deepseek_r1_gguf_starts_its_answer_inside_the_block_unless_thinking_is_off(imported):
    model = imported("r1-tiny", DEEPSEEK_R1)
    default = _render(model, HI, None)
    assert default.text.endswith("<｜Assistant｜><think>\n")
    assert default.opens_thinking
    off = _render(model, HI, None, think=False)
    assert off.text == default.text + "\n</think>\n\n"
    assert not off.opens_thinking


def test_earlier_thinking_reaches_the_template_as_reasoning_content(imported):
    model = imported("qwen3-tiny", QWEN3)
    history = [
        *HI,
        {"role": "assistant", "content": "Hello!", "thinking": "They greet me."},
        {"role": "user", "content": "Bye"},
    ]
    text = _render(model, history, None).text
    assert "<|im_start|>assistant\n<think>\nThey greet me.\n</think>\n\nHello!" in text


def test_asking_a_model_without_a_thinking_mode_to_think_is_a_400_naming_the_field(imported):
    model = imported("plain-tiny", "{% for m in messages %}{{ m.content }}{% endfor %}")
    for think in (True, "high"):
        with pytest.raises(ApiError) as refused:
            _render(model, HI, None, think=think)
        assert refused.value.status == 400
        assert refused.value.param == "think"
        assert '"plain-tiny" does not support thinking' in refused.value.message
    with pytest.raises(ApiError) as refused:
        _render(model, HI, None, think="low", think_param="reasoning_effort")
    assert refused.value.param == "reasoning_effort"
    with pytest.raises(ApiError):
        raw_prompt(model, "Hi", True)
    prompt = _render(model, HI, None, think=False)  # Home Assistant sends this every time
    assert prompt.text == "Hi" and not prompt.thinking


def test_a_raw_prompt_is_split_only_when_asked_to_think(imported):
    model = imported("r1-tiny", DEEPSEEK_R1)
    assert not raw_prompt(model, "<think>\n", None).thinking
    asked = raw_prompt(model, "Question<think>\n", True)
    assert asked.thinking and asked.opens_thinking


def test_think_takes_booleans_and_levels_and_constrained_output_goes_without_thinking():
    from pydantic import ValidationError

    from dashboard.api.ollama.schemas import OllamaChatRequest
    from dashboard.api.openai.schemas import ChatCompletionRequest

    def ollama(**fields):
        return OllamaChatRequest.model_validate({"model": "m", **fields})

    def openai(**fields):
        return ChatCompletionRequest.model_validate({"messages": HI, **fields})

    assert [ollama(think=v).think_switch for v in (None, False, True, "low", "high")] == [
        None, False, True, "low", "high"]  # fmt: skip
    for bad in ("maximum", "true", 1):
        with pytest.raises(ValidationError) as refused:
            ollama(think=bad)
        assert refused.value.errors()[0]["loc"][0] == "think"
    assert ollama(format="json").think_switch is False
    assert ollama(format="json", think=False).think_switch is False
    with pytest.raises(ValidationError, match="think cannot be combined with format"):
        ollama(format="json", think=True)

    efforts = ("none", "minimal", "low", "medium", "high")
    assert [openai(reasoning_effort=e).think for e in efforts] == [
        False, False, "low", "medium", "high"]  # fmt: skip
    assert openai().think is None
    assert openai(response_format={"type": "json_object"}).think is False
    with pytest.raises(ValidationError) as refused:
        openai(response_format={"type": "json_object"}, reasoning_effort="high")
    assert refused.value.errors()[0]["loc"][0] == "reasoning_effort"
