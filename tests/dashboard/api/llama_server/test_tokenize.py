"""llama-server's /tokenize, /detokenize and /apply-template, and Anthropic's count_tokens,
against the live appliance: the tokens are the model's own, counted from its runner, so they
agree with what a generation of the same text reports as its prompt_tokens."""

import anthropic
import httpx
import llama_cpp
import openai
import pytest

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé and 🌍 too."
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}]  # fmt: skip


@pytest.fixture
def openai_client(appliance) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                         max_retries=0, timeout=120)  # fmt: skip


def test_the_tokens_of_a_text_are_those_a_generation_of_it_counts(post, openai_client):
    tokens = post("/tokenize", {"model": STARTER, "content": TEXT, "add_special": True})
    assert tokens["model"] == STARTER and all(isinstance(t, int) for t in tokens["tokens"])
    answer = openai_client.completions.create(model=STARTER, prompt=TEXT, max_tokens=1)
    assert answer.usage.prompt_tokens == len(tokens["tokens"])
    plain = post("/tokenize", {"content": TEXT})  # llama-server's default: no BOS added
    assert len(plain["tokens"]) <= len(tokens["tokens"])


def test_parse_special_false_reads_special_tokens_text_as_plain_characters(post, starter_path):
    text = "end<|endoftext|>"
    parsed = post("/tokenize", {"content": text})["tokens"]
    plain = post("/tokenize", {"content": text, "parse_special": False})["tokens"]
    model = llama_cpp.Llama(str(starter_path), vocab_only=True, verbose=False)
    try:
        assert parsed == model.tokenize(text.encode(), add_bos=False, special=True)
        assert plain == model.tokenize(text.encode(), add_bos=False, special=False)
    finally:
        model.close()
    assert parsed[-1] == 0 and 0 not in plain and len(plain) > len(parsed)


def test_detokenize_gives_back_the_text_and_pieces_join_to_it(post):
    ids = post("/tokenize", {"content": TEXT})["tokens"]
    assert post("/detokenize", {"tokens": ids}) == {"model": STARTER, "content": TEXT}
    pieces = post("/tokenize", {"content": TEXT, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == ids
    joined = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
    )
    assert joined.decode() == TEXT


def test_ids_outside_the_vocabulary_and_bad_bodies_are_400s_naming_the_field(post):
    error = post("/detokenize", {"tokens": [1, 10_000_000]}, status=400)["error"]
    assert error["param"] == "tokens" and "vocabulary" in error["message"]
    assert post("/detokenize", {"tokens": [-1]}, status=400)["error"]["param"] == "tokens.0"
    assert post("/tokenize", {"content": 5}, status=400)["error"]["param"] == "content"
    error = post("/tokenize", {"content": "x", "parse_special": "no"}, status=400)["error"]
    assert error["param"] == "parse_special"
    assert post("/tokenize", {"model": "nope", "content": "x"}, status=404)["error"]


def test_apply_template_renders_the_prompt_chat_completions_sends(post, openai_client):
    prompt = post("/apply-template", {"model": STARTER, "messages": CHAT})["prompt"]
    assert "You are terse." in prompt and prompt.rstrip().endswith("assistant")
    answer = openai_client.chat.completions.create(model=STARTER, messages=CHAT, max_tokens=1)
    counted = post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
    assert answer.usage.prompt_tokens == len(counted)


def test_count_tokens_is_the_input_of_the_same_message(appliance):
    client = anthropic.Anthropic(base_url=appliance.url, api_key=appliance.keys["chat-app"],
                                 max_retries=0, timeout=120)  # fmt: skip
    asked = {"model": STARTER, "system": "You are terse.",
             "messages": [{"role": "user", "content": "Name a colour."}]}  # fmt: skip
    counted = client.messages.count_tokens(**asked)
    answer = client.messages.create(max_tokens=2, **asked)
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    assert counted.input_tokens > 5


def test_the_endpoints_need_a_key(appliance):
    for path in ("/tokenize", "/detokenize", "/apply-template", "/v1/messages/count_tokens"):
        answer = httpx.post(f"{appliance.url}{path}", json={"content": "x"}, timeout=30)
        assert answer.status_code == 401, path
