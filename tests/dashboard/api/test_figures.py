"""An answer's figures reach every dialect from one place: each Writer's final object and the
stream's last chunk carry figures.timings() of the answer's figures, so a figure added there is
in every dialect's output (OpenAI chat and completions, Responses, Anthropic, Ollama)."""

import json
from types import SimpleNamespace

import pytest

from dashboard.api.answer_parser import Piece
from dashboard.api.anthropic.views import MessagesWriter
from dashboard.api.figures import timings
from dashboard.api.ollama.views import LinesWriter
from dashboard.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from dashboard.api.openai.views import ChatWriter, CompletionWriter
from dashboard.api.pipeline import Ending
from dashboard.api.responses.schemas import ResponsesRequest
from dashboard.api.responses.views import ResponsesWriter

FIGURES = {"prompt_tokens": 12, "cached_tokens": 4, "output_tokens": 7, "prefill_time": 0.02,
           "ttft": 0.05, "queue_time": 0.001, "load_time": 0.0, "total_time": 0.3,
           "itl": {"p50": 0.01, "p95": 0.02, "p99": 0.03, "max": 0.04},
           "timeline": [{"phase": "decode", "start": 0.05, "end": 0.3}],
           "reasoning_tokens": 2, "restore_time": 0.0015, "drafted": 9, "draft_accepted": 6,
           "cached_by_tier": {"resident": 0, "ram": 4, "disk": 0}}  # fmt: skip
ENDING = Ending(Piece("", "Hello."), [], {"finish_reason": "stop", "figures": FIGURES}, FIGURES)
USER = [{"role": "user", "content": "Hi"}]


def answer() -> SimpleNamespace:
    # run: what the engine said when it admitted the request (Anthropic's message_start).
    run = SimpleNamespace(prompt_tokens=FIGURES["prompt_tokens"],
                          cached_tokens=FIGURES["cached_tokens"])  # fmt: skip
    return SimpleNamespace(id="1", name="m", take_logprobs=lambda: [], run=run)


def writers(stream: bool) -> dict:
    """A Writer of each dialect for one answer."""
    body = {"stream": stream}
    chat = ChatCompletionRequest.model_validate({"messages": USER, **body})
    completion = CompletionRequest.model_validate({"prompt": "Hi", **body})
    responses = ResponsesRequest.model_validate({"input": "Hi", **body})
    return {
        "openai chat": ChatWriter(answer(), chat),
        "openai completions": CompletionWriter(answer(), completion),
        "responses": ResponsesWriter(answer(), responses),
        "anthropic": MessagesWriter(answer()),
        "ollama chat": LinesWriter(answer(), "message"),
        "ollama generate": LinesWriter(answer(), "response"),
    }


def carried(value, found: list) -> list:
    """Every `timings` object anywhere in `value`."""
    if isinstance(value, dict):
        if "timings" in value:
            found.append(value["timings"])
        for item in value.values():
            carried(item, found)
    elif isinstance(value, list):
        for item in value:
            carried(item, found)
    return found


def chunk_data(chunk: bytes) -> dict:
    text = chunk.decode()
    line = next((ln for ln in text.splitlines() if ln.startswith("data: ")), text)
    return json.loads(line.removeprefix("data: ")) if line.strip() != "data: [DONE]" else {}


@pytest.mark.parametrize("dialect", list(writers(False)))
def test_every_dialects_whole_answer_carries_the_one_timings(dialect):
    final = writers(False)[dialect].final(ENDING)
    assert carried(final, []) == [timings(FIGURES)]
    assert timings(FIGURES)["reasoning_n"] == 2  # the thinking's tokens, in every dialect


@pytest.mark.parametrize("dialect", list(writers(True)))
def test_every_dialects_stream_ends_with_the_one_timings(dialect):
    chunks = writers(True)[dialect].ending(ENDING)
    found = [t for chunk in chunks for t in carried(chunk_data(chunk), [])]
    assert found and all(t == timings(FIGURES) for t in found)


@pytest.mark.parametrize("dialect", list(writers(False)))
def test_every_dialect_says_where_cached_tokens_came_from_and_what_speculation_did(dialect):
    (found,) = carried(writers(False)[dialect].final(ENDING), [])
    assert (found["cache_n_resident"], found["cache_n_ram"], found["cache_n_disk"]) == (0, 4, 0)
    assert found["cache_n"] == 4 and found["restore_ms"] == 1.5
    assert (found["draft_n"], found["draft_n_accepted"]) == (9, 6)


@pytest.mark.parametrize("dialect", list(writers(False)))
def test_every_dialect_says_what_reading_the_images_took_and_text_says_zero(dialect):
    pictures = {**FIGURES, "encode_time": 0.1834, "image_tokens": 64, "images_encoded": 1}
    seen = Ending(Piece("", "A cat."), [], {"finish_reason": "stop", "figures": pictures}, pictures)
    (found,) = carried(writers(False)[dialect].final(seen), [])
    assert (found["encode_ms"], found["image_n"]) == (183.4, 64)
    (text,) = carried(writers(False)[dialect].final(ENDING), [])
    assert (text["encode_ms"], text["image_n"]) == (0.0, 0)
