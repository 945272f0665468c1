"""An image in a request: sniffed at the edge, carried whole to the runner, in any process."""

import base64

import pytest

from inference.engine import GenerationRequest, Refused
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import MEDIA_MARKER, Image, sniff
from tests.inference.projector_gguf import picture


def test_an_image_is_known_by_its_magic_bytes_and_its_sha256():
    png = picture(kind="png")
    image = Image.from_bytes(png)
    assert (image.kind, len(image.digest)) == ("png", 64)
    assert Image.from_bytes(picture(kind="bmp")).kind == "bmp"
    assert Image.from_bytes(png).digest == image.digest
    assert Image.from_bytes(picture(seed=4)).digest != image.digest


@pytest.mark.parametrize("data", [b"", b"not a picture at all", b"<svg></svg>"])
def test_bytes_that_are_no_picture_are_refused_naming_the_field(data):
    with pytest.raises(Refused) as refused:
        Image.from_bytes(data, field="messages")
    assert refused.value.kind == "invalid" and refused.value.field == "messages"


def test_webp_is_refused_with_the_formats_that_work():
    webp = b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8)
    assert sniff(webp) == "webp"
    with pytest.raises(Refused, match="WEBP images are not supported"):
        Image.from_bytes(webp)


def test_base64_that_does_not_decode_is_refused():
    with pytest.raises(Refused, match="not valid base64"):
        Image.from_base64("this is %% not base64")
    assert Image.from_base64(base64.b64encode(picture()).decode()).kind == "png"


def test_base64_wrapped_in_lines_is_the_same_image_as_ollama_reads_it():
    # Go's decoder, which reads Ollama's `images`, skips line breaks: a client that wraps its
    # base64 at 76 columns (Python's encodebytes, MIME) gets the picture there.
    wrapped = base64.encodebytes(picture()).decode()
    assert "\n" in wrapped.strip()
    assert Image.from_base64(wrapped) == Image.from_bytes(picture())
    assert Image.from_base64(wrapped.replace("\n", "\r\n")) == Image.from_bytes(picture())
    with pytest.raises(Refused, match="not valid base64"):  # other whitespace is still no base64
        Image.from_base64(wrapped.replace("\n", " "))


def test_a_request_holds_one_marker_per_image():
    image = Image.from_bytes(picture())
    request = GenerationRequest(f"look: {MEDIA_MARKER} what is it?", media=[image])
    assert request.media == (image,)
    with pytest.raises(Refused, match="one media marker per image"):
        GenerationRequest("no marker here", media=(image,))
    with pytest.raises(Refused, match="one media marker per image"):
        GenerationRequest((1, 2, 3), media=(image,))


def test_a_request_with_too_many_images_is_refused():
    image = Image.from_bytes(picture())
    with pytest.raises(Refused, match=f"at most {MAX_IMAGES} images"):
        GenerationRequest(MEDIA_MARKER * (MAX_IMAGES + 1), media=(image,) * (MAX_IMAGES + 1))


def test_images_cross_split_mode_as_json_unchanged():
    images = (Image.from_bytes(picture()), Image.from_bytes(picture(kind="bmp", seed=9)))
    request = GenerationRequest(f"{MEDIA_MARKER} and {MEDIA_MARKER}", media=images)
    assert GenerationRequest.from_wire(request.to_wire()) == request


def test_an_image_whose_digest_does_not_match_its_bytes_is_refused_on_the_wire():
    wire = GenerationRequest(MEDIA_MARKER, media=(Image.from_bytes(picture()),)).to_wire()
    wire["media"][0]["digest"] = "0" * 64
    with pytest.raises(Refused, match="digest does not match"):
        GenerationRequest.from_wire(wire)
