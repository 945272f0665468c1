"""Images end to end on the served appliance (`manage.py serve`, the starter model imported with
the tiny projector by `import_model --mmproj`), through the real `ollama` and `openai` clients:
the model says it takes images, an image adds its tokens to the prompt and changes the answer,
the same picture again is read from the cache, count_tokens counts the images without encoding
them, and bad pictures cost their request only."""

import base64
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import psutil
import pytest

from tests.inference.engine.picture_decoders import wait_until_the_pipe_holds
from tests.inference.projector_gguf import IMAGE_TOKENS, picture, write_projector
from tests.live import LiveAppliance

pytestmark = pytest.mark.model

MODEL = "smollm2-vision"
SETUP = f"""
from inference.models import LLMModel
LLMModel.objects.filter(name={MODEL!r}).update(
    n_ctx=2048, parallel=2, n_threads=2, keep_alive="-1", default_params={{"temperature": 0}})
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory, starter_path):
    data = tmp_path_factory.mktemp("images-live")
    mmproj = write_projector(data / "mmproj-tiny.gguf", Path(starter_path))
    appliance = LiveAppliance(data, API_RATE_LIMIT_PER_MINUTE="10000", LOG_LEVEL="WARNING")
    appliance.manage("migrate", "--no-input", "-v", "0")
    appliance.manage("import_model", str(starter_path), "--mmproj", str(mmproj), "--name", MODEL)
    appliance.shell(SETUP)
    key = appliance.manage("create_api_key", "camera").strip()
    appliance.start()
    try:
        yield appliance, key
    finally:
        appliance.stop()


def png(seed: int) -> bytes:
    return picture(96, 72, seed=seed)


def test_ollama_chat_reads_the_images_of_a_message(served):
    appliance, key = served
    client = ollama.Client(host=appliance.url, headers={"Authorization": f"Bearer {key}"})
    assert "vision" in client.show(MODEL).capabilities

    def ask(images):
        message = {"role": "user", "content": "What is in the picture?", "images": images}
        return client.chat(model=MODEL, messages=[message], options={"num_predict": 12})

    first, second = ask([png(1)]), ask([png(2)])
    # prompt_eval_count is what was read, as Ollama counts it: a new picture is never cached.
    assert first.prompt_eval_count >= IMAGE_TOKENS and second.prompt_eval_count >= IMAGE_TOKENS
    assert first.message.content != second.message.content, "the answer depends on the picture"
    again = ask([png(1)])
    assert again.message.content == first.message.content, "temperature 0, the same picture"


def test_an_image_adds_its_tokens_to_the_prompt(served):
    appliance, key = served
    client = openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=key)
    url = "data:image/png;base64," + base64.b64encode(png(7)).decode()
    plain = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
        {"role": "user", "content": "Describe it."}])  # fmt: skip
    parts = [{"type": "text", "text": "Describe it."},
             {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    pictured = client.chat.completions.create(model=MODEL, max_tokens=2,
                                              messages=[{"role": "user", "content": parts}])
    assert pictured.usage.prompt_tokens == plain.usage.prompt_tokens + IMAGE_TOKENS


def test_ollama_generate_takes_images_too(served):
    appliance, key = served
    client = ollama.Client(host=appliance.url, headers={"Authorization": f"Bearer {key}"})
    pictured = client.generate(model=MODEL, prompt="Describe it.", images=[png(3)],
                               options={"num_predict": 4})  # fmt: skip
    assert pictured.prompt_eval_count >= IMAGE_TOKENS and pictured.response


def test_the_same_picture_with_a_new_question_reads_most_of_its_prompt_from_the_cache(served):
    appliance, key = served
    client = openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=key)
    url = "data:image/png;base64," + base64.b64encode(png(4)).decode()
    conversation = [{"role": "user", "content": [
        {"type": "text", "text": "Here is the porch camera."},
        {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip
    first = client.chat.completions.create(model=MODEL, messages=conversation, max_tokens=8)
    conversation += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Is anyone at the door?"}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=conversation, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.8 * second.usage.prompt_tokens, (cached, second.usage.prompt_tokens)


def image_counters(appliance, key) -> tuple[int, int]:
    """The images the served runner encoded and found in its cache, from /metrics."""
    text = httpx.get(f"{appliance.url}/metrics", headers={"Authorization": f"Bearer {key}"},
                     timeout=30).text  # fmt: skip

    def total(name: str) -> int:
        return sum(int(float(v)) for v in re.findall(rf"^{name}_total{{.*}} (\S+)$", text, re.M))

    return total("appliance_images_encoded"), total("appliance_images_cached")


def image_block(data: bytes) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(data).decode()}}  # fmt: skip


@pytest.mark.parametrize("pictures", [1, 2])
def test_count_tokens_with_images_is_the_prompt_of_the_same_message_and_encodes_nothing(
    served, pictures
):
    appliance, key = served
    client = anthropic.Anthropic(base_url=appliance.url, api_key=key, max_retries=0)
    content = [*(image_block(png(30 + 10 * pictures + n)) for n in range(pictures)),
               {"type": "text", "text": "What changed between the frames?"}]  # fmt: skip
    asked = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    client.messages.create(max_tokens=1, model=MODEL, messages=[
        {"role": "user", "content": "Hi"}])  # the model is loaded before the counters are read
    before = image_counters(appliance, key)
    counted = client.messages.count_tokens(**asked).input_tokens
    assert image_counters(appliance, key) == before, "counting encoded nothing"
    usage = client.messages.create(max_tokens=2, **asked).usage
    assert counted == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert counted > pictures * IMAGE_TOKENS
    # The answer encoded every new picture itself: the count left none in the encoder's cache.
    encoded, cached = image_counters(appliance, key)
    assert (encoded - before[0], cached - before[1]) == (pictures, 0)


def test_count_tokens_refuses_a_corrupt_picture_as_the_message_does(served):
    appliance, key = served
    client = anthropic.Anthropic(base_url=appliance.url, api_key=key, max_retries=0)
    corrupt = png(50)[:40] + b"\x00" * 200
    asked = {"model": MODEL, "messages": [{"role": "user", "content": [image_block(corrupt)]}]}
    with pytest.raises(anthropic.BadRequestError) as counted:
        client.messages.count_tokens(**asked)
    with pytest.raises(anthropic.BadRequestError) as answered:
        client.messages.create(max_tokens=2, **asked)
    assert counted.value.body == answered.value.body
    good = {"model": MODEL, "messages": [{"role": "user", "content": [image_block(png(51))]}]}
    assert client.messages.count_tokens(**good).input_tokens > IMAGE_TOKENS


def test_bad_pictures_are_refused_and_the_next_request_is_answered(served):
    appliance, key = served
    headers = {"Authorization": f"Bearer {key}"}

    def chat(image_url: str) -> httpx.Response:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": image_url}}]}]}  # fmt: skip
        return httpx.post(f"{appliance.url}/v1/chat/completions", json=body, headers=headers,
                          timeout=120)  # fmt: skip

    corrupt = base64.b64encode(png(5)[:40] + b"\x00" * 200).decode()
    assert chat(f"data:image/png;base64,{corrupt}").status_code == 400
    assert chat("http://camera.invalid/frame.jpg").status_code == 400
    good = chat("data:image/png;base64," + base64.b64encode(png(6)).decode())
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["message"]["content"]


def picture_decoder(appliance) -> psutil.Process:
    """The served runner's picture decoder process (inference.engine.picture_decoder)."""
    for child in psutil.Process(appliance.process.pid).children(recursive=True):
        if "inference.engine.picture_decoder" in " ".join(child.cmdline()):
            return child
    raise AssertionError("the runner has no picture decoder process")


def test_a_decoder_killed_before_it_read_a_picture_is_replaced_and_the_picture_answered(served):
    """Pictures are decoded in a process of the runner's own. Frozen with a picture waiting
    for it and then killed (as the OOM killer might), the decoder is replaced: the picture was
    never in its hands, so it is decoded by the next one and answered, and the runner (the
    same process) never noticed. (A decoder that dies on a picture it holds fails that request
    alone: tests/inference/serving/test_llama_runners.py.)"""
    appliance, key = served
    headers = {"Authorization": f"Bearer {key}"}

    def describe(data: bytes) -> httpx.Response:
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip
        return httpx.post(f"{appliance.url}/v1/chat/completions", json=body, headers=headers,
                          timeout=120)  # fmt: skip

    assert describe(png(8)).status_code == 200  # the model is loaded, its decoder started
    decoder = picture_decoder(appliance)
    runner = decoder.parent()
    waiting = png(9)
    decoder.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(describe, waiting)
            wait_until_the_pipe_holds(decoder, 0, 8 + len(waiting))  # its length, its bytes
            decoder.send_signal(signal.SIGKILL)
            answered = answer.result()
    finally:
        if decoder.is_running():
            decoder.send_signal(signal.SIGKILL)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"]
    replacement = picture_decoder(appliance)
    assert replacement.pid != decoder.pid and replacement.parent().pid == runner.pid
