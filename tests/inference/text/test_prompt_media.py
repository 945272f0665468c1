"""Images in the one prompt path (inference.text.prompting): a message's parts reach the template
as llama-server renders them (text parts joined by a newline, none before or after a media
marker), and the prompt's images are the request's media in the order of its markers, wherever
the template puts the messages."""

import pytest

from dashboard.api.pipeline import api_request
from inference.catalog.importing import register_file
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.refusals import Refused
from inference.gguf.chat_template import ChatTemplateError
from inference.models import LLMModel
from inference.text.prompting import join_parts, prompt_for, raw_prompt, render_prompt
from tests.inference.ggufs import tiny_gguf
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.django_db

M = MEDIA_MARKER
RED, GREEN, BLUE = (Image.from_bytes(picture(seed=seed)) for seed in (1, 2, 3))


@pytest.fixture
def templated(settings, tmp_path):
    """templated(name, template): a tiny GGUF model rendering with `template`."""
    settings.MODELS_DIR = tmp_path

    def register(name: str, template: str) -> LLMModel:
        path = tiny_gguf(tmp_path / f"{name}.gguf", chat_template=template)
        return register_file(path, source=LLMModel.Source.SCAN, name=name, hash_file=False)

    return register


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        (["What is this?", RED], f"What is this?{M}"),  # one image after text
        ([RED, GREEN, "Compare them."], f"{M}{M}Compare them."),  # two images before text
        (["One", "two", RED, "three", "four"], f"One\ntwo{M}three\nfour"),
        ([RED, "", "x"], f"{M}\nx"),  # llama-server's rule, empty parts included
        (["", "x", RED], f"x{M}"),
    ],
)  # fmt: skip
def test_parts_are_joined_as_llama_server_joins_them(parts, text):
    assert join_parts(parts) == text


def test_a_message_with_images_reaches_the_template_as_its_joined_text(templated):
    model = templated("chatml", CHATML)
    parts = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": ["What is this?", RED]}]  # fmt: skip
    prompt = prompt_for(model, parts)
    as_text = render_prompt(model, [parts[0], {"role": "user", "content": f"What is this?{M}"}])
    assert prompt.text == as_text
    assert prompt.media == (RED,)


def test_the_images_are_the_media_in_the_order_of_their_markers_across_turns(templated):
    model = templated("chatml", CHATML)
    conversation = [
        {"role": "user", "content": [RED, "And this one?", GREEN]},
        {"role": "assistant", "content": "Two pictures."},
        {"role": "user", "content": ["Now this:", BLUE]},
    ]
    prompt = prompt_for(model, conversation)
    assert prompt.media == (RED, GREEN, BLUE)
    assert prompt.text.count(M) == 3
    assert f"<|im_start|>user\n{M}And this one?{M}<|im_end|>" in prompt.text


def test_a_template_that_reorders_messages_reorders_the_media_with_their_markers(templated):
    backwards = "{% for m in messages|reverse %}[{{ m.content }}]{% endfor %}"
    model = templated("backwards", backwards)
    prompt = prompt_for(model, [{"role": "user", "content": ["first", RED]},
                                {"role": "user", "content": ["second", GREEN]}])  # fmt: skip
    assert prompt.text == f"[second{M}][first{M}]"
    assert prompt.media == (GREEN, RED)


def test_a_template_that_drops_an_image_is_refused_rather_than_the_image_lost(templated):
    last_only = "{{ messages[-1].content }}"
    model = templated("last-only", last_only)
    with pytest.raises(ChatTemplateError, match="every image"):
        prompt_for(model, [{"role": "user", "content": ["a", RED]},
                           {"role": "user", "content": "b"}])  # fmt: skip


def test_text_that_holds_the_media_marker_beside_images_is_refused(templated):
    model = templated("chatml", CHATML)
    with pytest.raises(Refused) as refused:
        prompt_for(model, [{"role": "user", "content": [f"sneaky {M}", RED]}])
    assert refused.value.kind == "invalid" and refused.value.field == "messages"
    # Without images it is only text.
    assert prompt_for(model, [{"role": "user", "content": f"sneaky {M}"}]).media == ()


def test_a_raw_prompt_carries_its_images_where_they_are(templated):
    model = templated("chatml", CHATML)
    prompt = raw_prompt(model, [RED, "USER: what is it? ASSISTANT:"])
    assert prompt.text == f"{M}USER: what is it? ASSISTANT:" and prompt.media == (RED,)


def test_the_request_carries_the_prompts_images_as_its_media(templated):
    model = templated("chatml", CHATML)
    prompt = prompt_for(model, [{"role": "user", "content": [RED, GREEN, "Same?"]}])
    request = api_request(model, prompt, {})
    assert request.prompt == prompt.text and request.media == (RED, GREEN)
    # And a Continue keeps them (the chat page's partial answer).
    assert prompt.then("They").media == (RED, GREEN)
