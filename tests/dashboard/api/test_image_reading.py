"""How an image in a body is read (dashboard.api.images): a data: URL or bare base64 becomes an
Image, anything to fetch or that is no picture is refused saying why, and Ollama's images are
placed as Ollama places them."""

import base64

import pytest

from dashboard.api.images import image_from_url, ollama_parts, ollama_raw_parts
from inference.engine.media import Image
from tests.inference.projector_gguf import picture

PNG = picture(seed=1)
A, B, C = (Image.from_bytes(picture(seed=seed)) for seed in (4, 5, 6))


def test_a_data_url_and_bare_base64_are_the_same_image():
    text = base64.b64encode(PNG).decode()
    assert image_from_url(f"data:image/png;base64,{text}") == Image.from_bytes(PNG)
    assert image_from_url(text) == Image.from_bytes(PNG)  # as llama-server takes it
    # The bytes say what the picture is, not the declared type.
    assert image_from_url(f"data:image/jpeg;base64,{text}").kind == "png"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://example.com/cat.png", "not fetched"),
        ("HTTP://192.168.1.5/snapshot.jpg", "not fetched"),
        ("file:///etc/passwd", "file: image URLs are not supported"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:text/plain;base64,aGk=", "'text/plain' is not an image"),
        ("data:image/png;base64,aGk=", "not a JPEG, PNG, GIF or BMP"),
        ("data:image/png;base64,***", "not valid base64"),
        ("", "non-empty string"),
    ],
)  # fmt: skip
def test_what_is_no_image_to_read_is_refused_saying_why(url, says):
    with pytest.raises(ValueError, match=says):
        image_from_url(url)


def test_ollama_images_go_before_the_text_without_placeholders():
    assert ollama_parts("What is it?", [A, B]) == [A, B, "What is it?"]
    assert ollama_parts("No images.", []) == "No images."


def test_placeholders_take_the_images_in_order_and_the_rest_go_before():
    assert ollama_parts("1: [img] 2: [img]", [A, B, C]) == [C, "1: ", A, " 2: ", B]
    # More placeholders than images: the rest stay text, as in Ollama.
    assert ollama_parts("[img][img]", [A]) == [A, "[img]"]


def test_a_raw_prompt_places_images_by_ollamas_own_tags():
    assert ollama_raw_parts("[img-1] then [img-0]", [A, B]) == [B, " then ", A]
    assert ollama_raw_parts("untagged", [A]) == [A, "untagged"]
    with pytest.raises(ValueError, match=r"\[img-2\] names no image"):
        ollama_raw_parts("[img-2]", [A, B])
    with pytest.raises(ValueError, match="but not image 1"):
        ollama_raw_parts("[img-0]", [A, B])
