"""llama-server's /completion and /props against the live appliance, over plain HTTP: a prompt
as text, token ids or both mixed reads the same tokens and gives the same greedy answer; the
stream is llama-server's `data:` lines ending with its final object; its sampling fields
(ignore_eos, stop, logit_bias, json_schema) are honoured and what the engine cannot honour is a
400 naming it. And an unknown path answers an API client in JSON, a browser in HTML."""

import json

import httpx
import pytest

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"temperature": 0, "n_predict": 12}


def tokens(post, text: str, add_special: bool) -> list[int]:
    return post("/tokenize", {"content": text, "add_special": add_special})["tokens"]


def test_a_text_prompt_gets_llama_servers_final_object(post):
    answer = post("/completion", {"prompt": "The sky is", **GREEDY})
    assert answer["content"] and answer["stop"] is True
    assert answer["model"] == STARTER
    assert answer["stop_type"] in ("eos", "limit")
    if answer["stop_type"] == "limit":
        assert answer["tokens_predicted"] == 12
    assert answer["tokens_evaluated"] == len(tokens(post, "The sky is", add_special=True))
    assert answer["generation_settings"]["n_predict"] == 12
    assert answer["generation_settings"]["temperature"] == 0
    timings = answer["timings"]
    # llama-server counts a sampled end-of-generation token as predicted; it is no output.
    assert timings["predicted_n"] + (answer["stop_type"] == "eos") == answer["tokens_predicted"]
    assert timings["prompt_n"] + timings["cache_n"] == answer["tokens_evaluated"]
    assert {"prompt_per_token_ms", "predicted_per_token_ms", "predicted_per_second"} <= set(timings)


def test_token_ids_and_mixed_prompts_read_the_same_tokens_as_text(post):
    text = post("/completion", {"prompt": CHAT, **GREEDY})
    ids = tokens(post, CHAT, add_special=True)
    by_ids = post("/completion", {"prompt": ids, **GREEDY})
    assert (by_ids["content"], by_ids["tokens_evaluated"]) == (text["content"], len(ids))
    # Ids, then text tokenized in place (no BOS in the middle), as llama-server's tokenize_mixed.
    head, tail = CHAT[:20], CHAT[20:]
    mixed = post("/completion", {"prompt": [*tokens(post, head, True), tail], **GREEDY})
    expected = tokens(post, head, True) + tokens(post, tail, False)
    same = post("/completion", {"prompt": expected, **GREEDY})
    assert mixed["tokens_evaluated"] == len(expected)
    assert mixed["content"] == same["content"]


def test_the_stream_is_data_lines_ending_with_the_final_object(http, chat_headers, post):
    whole = post("/completion", {"prompt": CHAT, **GREEDY})
    with http.stream("POST", "/completion", json={"prompt": CHAT, "stream": True, **GREEDY},
                     headers=chat_headers) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)  # and no [DONE], as llama-server
    events = [json.loads(line[6:]) for line in lines]
    *pieces, final = events
    assert pieces and all(e["stop"] is False and e["content"] for e in pieces)
    assert "".join(e["content"] for e in pieces) == whole["content"]
    assert final["stop"] is True and final["content"] == ""
    assert final["tokens_predicted"] == whole["tokens_predicted"]
    assert final["stop_type"] == whole["stop_type"]


def test_ignore_eos_runs_to_n_predict(post):
    ended = post("/completion", {"prompt": CHAT, "temperature": 0, "n_predict": 64})
    assert ended["stop_type"] == "eos" and ended["tokens_predicted"] < 64
    assert ended["tokens_predicted"] == ended["timings"]["predicted_n"] + 1  # the EOS, as theirs
    on = post("/completion", {"prompt": CHAT, "temperature": 0, "n_predict": 64,
                              "ignore_eos": True})  # fmt: skip
    assert on["stop_type"] == "limit" and on["tokens_predicted"] == 64
    assert on["content"].startswith(ended["content"])


def test_a_stop_word_ends_the_answer_and_is_named(post):
    whole = post("/completion", {"prompt": CHAT, **GREEDY})["content"]
    word = whole.split()[1]
    answer = post("/completion", {"prompt": CHAT, **GREEDY, "stop": [word]})
    assert answer["stop_type"] == "word" and answer["stopping_word"] == word
    assert answer["content"] == whole[: whole.index(word)]


def test_a_banned_first_token_changes_the_answer(post):
    ids = tokens(post, CHAT, add_special=True)
    first = post("/completion", {"prompt": ids, "temperature": 0, "n_predict": 1})["content"]
    [token] = tokens(post, first, add_special=False)
    for bias in ([[token, False]], {str(token): -100}):
        other = post("/completion", {"prompt": ids, "temperature": 0, "n_predict": 1,
                                     "logit_bias": bias})  # fmt: skip
        assert other["content"] != first


def test_a_json_schema_holds_the_output_to_it(post):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"]}  # fmt: skip
    answer = post("/completion", {"prompt": CHAT, "temperature": 0, "n_predict": 40,
                                  "json_schema": schema})  # fmt: skip
    assert isinstance(json.loads(answer["content"])["city"], str)


def test_n_predict_0_reads_the_prompt_into_the_cache_and_answers_nothing(post):
    prompt = CHAT * 6
    warm = post("/completion", {"prompt": prompt, "n_predict": 0})
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    assert warm["stop_type"] == "limit" and warm["generation_settings"]["n_predict"] == 0
    assert warm["tokens_evaluated"] == len(tokens(post, prompt, add_special=True))
    # The warm-up's prompt is in the cache: the next request reads only what follows it.
    answer = post("/completion", {"prompt": prompt + "Paris", **GREEDY})
    assert answer["timings"]["cache_n"] >= warm["tokens_evaluated"] - 1
    assert answer["timings"]["prompt_n"] < answer["tokens_evaluated"] // 2


def test_response_fields_keep_only_the_fields_named_streamed_or_not(http, chat_headers, post):
    fields = ["content", "timings/predicted_n", "generation_settings/n_predict", "no_such"]
    body = {"prompt": CHAT, **GREEDY, "ignore_eos": True, "response_fields": fields}
    answer = post("/completion", body)
    assert set(answer) == set(fields[:3])
    assert answer["timings/predicted_n"] == 12 and answer["generation_settings/n_predict"] == 12
    assert answer["content"] == post("/completion", {**body, "response_fields": None})["content"]
    with http.stream("POST", "/completion", json={**body, "stream": True},
                     headers=chat_headers) as response:  # fmt: skip
        lines = [json.loads(line[6:]) for line in response.iter_lines() if line]
    *pieces, final = lines
    assert "".join(piece["content"] for piece in pieces) == answer["content"]
    assert final == {**answer, "content": ""}  # the pieces carry the text, as llama-server's


@pytest.mark.parametrize(("fields", "param"), [
    ({"n_predict": -2}, "n_predict"),
    ({"temperature": -1}, "temperature"),
    ({"typical_p": 2}, "typical_p"),
    ({"mirostat": 2}, "mirostat"),
    ({"dry_multiplier": 0.8}, "dry_multiplier"),
    ({"n_probs": 3}, "n_probs"),
    ({"samplers": ["temperature", "top_k"]}, "samplers"),
    ({"samplers": ["bogus"]}, "samplers"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, -4]}, "prompt"),
    ({"prompt": [1, 10**9]}, "prompt"),
    ({"logit_bias": [[5, 101]]}, "logit_bias"),
    ({"grammar": "root ::= \"a\"", "json_schema": {"type": "object"}}, "json_schema"),
])  # fmt: skip
def test_a_field_the_engine_cannot_honour_is_a_400_naming_it(post, fields, param):
    error = post("/completion", {"prompt": "hi", "n_predict": 2, **fields}, status=400)["error"]
    assert error["param"] == param, error


def test_props_describe_the_model_as_llama_server_does(http, chat_headers, post):
    props = http.get("/props", headers=chat_headers).json()
    assert props["model_alias"] == STARTER
    assert props["model_path"].endswith(".gguf")
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert "<|im_start|>" in props["chat_template"]
    assert props["total_slots"] >= 1
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] > 0
    assert {"temperature", "top_k", "top_p", "min_p", "n_predict", "samplers"} <= set(
        settings["params"])
    assert props["bos_token"] and props["eos_token"]
    assert http.get("/props", params={"model": "no-such-model"},
                    headers=chat_headers).status_code == 404  # fmt: skip
    assert http.get("/props").status_code == 401  # keyed, as every route but /api/openapi.json


@pytest.mark.parametrize(("path", "headers"), [
    ("/slots", {}),
    ("/lora-adapters", {"Accept": "text/html"}),
    ("/v1x/whatever", {"Accept": "text/html"}),
    ("/no-such-page", {"Accept": "application/json"}),
    ("/no-such-page", {"Accept": "*/*"}),
])  # fmt: skip
def test_an_unknown_path_answers_an_api_client_in_json(appliance, path, headers):
    answer = httpx.get(appliance.url + path, headers=headers)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == f"there is no endpoint {path}"


def test_an_unknown_path_posted_json_answers_json(appliance):
    answer = httpx.post(appliance.url + "/no-such-page", json={"x": 1},
                        headers={"Accept": "text/html"})  # fmt: skip
    assert answer.status_code == 404 and answer.json()["error"]["type"]


def test_a_browser_still_gets_the_html_404_page(appliance):
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    answer = httpx.get(appliance.url + "/no-such-page", headers={"Accept": browser})
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("text/html")
