"""One prompt path: the chat page and every API dialect turn the same messages into the same
request (inference.text.prompting, inference.catalog.specs.request_for), BOS rule included."""

from types import SimpleNamespace

import pytest

from dashboard.api.pipeline import api_request
from dashboard.api.templating import _render, raw_prompt
from dashboard.chat import turn_request
from inference.catalog.importing import register_file
from inference.models import LLMModel
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db

# A template that writes the BOS token itself, as Llama 3's and Gemma's do.
WRITES_BOS = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def bos_model(settings, tmp_path) -> LLMModel:
    settings.MODELS_DIR = tmp_path
    path = tiny_gguf(tmp_path / "bos.gguf", chat_template=WRITES_BOS)
    model = register_file(path, source=LLMModel.Source.SCAN, name="bos-tiny", hash_file=False)
    model.metadata = {**(model.metadata or {}), "bos_token": "<s>"}
    model.default_params = {"temperature": 0.2, "grammar": "root ::= \"x\"", "top_k": "odd"}
    model.save()
    return model


def chat_request(model: LLMModel, question: str):
    prompt = turn_request.build(model, None, "", [], [{"role": "user", "content": question}])
    conversation = SimpleNamespace(pk=7, user_id=3)
    return turn_request.answer_request(model, prompt, conversation, arrived=0.0)


def test_the_chat_page_and_the_api_send_the_same_prompt_with_one_bos(bos_model):
    chat = chat_request(bos_model, "Hi")
    api = api_request(bos_model, _render(bos_model, [{"role": "user", "content": "Hi"}],
                                         None).prompt, {})  # fmt: skip

    assert chat.prompt == api.prompt and chat.prompt.startswith("<s><|user|>Hi")
    assert chat.prompt.count("<s>") == 1
    # The template wrote the BOS: neither path lets the tokenizer add a second one.
    assert chat.add_special is False and api.add_special is False


def test_a_raw_prompt_without_the_bos_gets_it_from_the_tokenizer(bos_model):
    assert raw_prompt(bos_model, "Hello").prompt.add_special is True
    assert raw_prompt(bos_model, "<s>Hello").prompt.add_special is False


def test_both_paths_apply_the_models_sampling_defaults_the_same_way(bos_model):
    chat = chat_request(bos_model, "Hi")
    api = api_request(bos_model, raw_prompt(bos_model, "Hi").prompt, {"top_p": 0.5})

    # Its usable defaults apply on both; its grammar and its unusable top_k on neither.
    assert chat.params.temperature == api.params.temperature == 0.2
    assert chat.params.grammar is None and api.params.grammar is None
    assert chat.params.top_k == api.params.top_k == 40  # the engine's own
    assert api.params.top_p == 0.5  # what the request asks goes over the defaults
