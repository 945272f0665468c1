"""The answer pipeline: one path from a parsed body of any dialect to a running answer, and one
consumer of its events. A dialect (openai/, responses/, anthropic/, ollama/) is a small adapter
over it: its body's `ask()` says what the body asks in the pipeline's terms (an Ask), and its
Writer says how it writes chunks, its final object and errors.

Starting an answer (`start`), the same for every dialect:
1. the model the body names (`resolve_model`; 404 for a name the catalog does not know);
2. the prompt: the conversation through the model's template with its tools and thinking switch,
   or a prompt sent as is (dashboard.api.templating; a 400 names the body's field), or code to
   fill in the middle of, as token ids (dashboard.api.fim; a 400 for a model without FIM
   tokens); its images,
   parts of the messages' content where they were sent (dashboard.api.images), become the
   prompt's media markers and the request's media (inference.text.prompting), after a 400 for
   more than MAX_IMAGES or for a model that takes none (LLMModel.takes_images);
3. the constraints: the body's sampling, plus the tool-call grammar where the answer may hold
   calls and the body sets no grammar of its own;
4. the request (inference.catalog.specs.request_for): the caller's fields from its key
   (dashboard.api.auth.caller_fields: cache key and partition, priority, share) and the
   keep-alive its key is granted; its clock started when it reached the application;
5. the run (dashboard.api.run.Run): submitted, and its first event awaited, so that a refusal
   is an HTTP status before any byte of the answer.
`start_choices` does the same for n answers to one prompt (OpenAI's n), each a request of its
own that the engine batches beside the others; `launch` is steps 3 to 5 for a prompt rendered
elsewhere (llama-server's /completion sends token ids with no template).

Consuming it: `stream` (stream: true) or `whole` (stream: false) reads the run's events, feeds
each token's text to the answer's parser (its thinking and content split, tool calls parsed),
and hands the Writer what is final: pieces as they come, then an Ending (the rest, the calls,
the done event and the answer's figures, dashboard.api.figures), or an error. A streamed
answer's TTFT is stamped after the first chunk written once it has output (dashboard.wire);
however it ends, the run is closed (a client that left cancels its generation) and recorded.
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from appliance.arrival import arrived_wall
from dashboard.api.answer_parser import AnswerParser, Piece
from dashboard.api.auth import app_id, caller_fields, granted_keep_alive
from dashboard.api.errors import ApiError, from_event, from_refusal
from dashboard.api.fim import check_insert, infill_prompt
from dashboard.api.logprobs import TokenEntry
from dashboard.api.run import Run
from dashboard.api.streaming import stream_response
from dashboard.api.templating import ChatPrompt, chat_prompt, raw_prompt
from dashboard.api.tools import ToolCall
from inference.catalog.lookup import UnknownModel, resolve
from inference.catalog.specs import context_asked, request_for, spec_for
from inference.engine import GenerationRequest, Refused
from inference.engine.generation import MAX_IMAGES, Priority
from inference.engine.media import Image
from inference.engine.params import SEED_LIMIT
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.tokens import TokenError, TokenResult
from inference.text.infill import InfillText
from inference.text.prompting import Content, Prompt, images_of
from inference.text.thinking import Think

# OpenAI's n: the most answers one request may ask for. Each is a sequence of its own in the
# engine's batch, so this bounds what one request can take of the box's slots.
MAX_CHOICES = 8


@dataclass(slots=True, kw_only=True)
class Ask:
    """What a body asks, in the pipeline's terms: every dialect's body maps onto this."""

    model: str  # the name asked; "" for the default model
    # The conversation, OpenAI-style (templating reads it); a content may be parts, text and
    # Images in the order sent (inference.text.prompting.Content).
    messages: list[dict] | None = None
    prompt: Content | None = None  # or a prompt sent as is (completions, Ollama's raw)
    # Or code to fill in the middle of (/infill, a `suffix`): its FIM prompt (dashboard.api.fim).
    infill: InfillText | None = None
    images_param: str = "messages"  # the body's field that carries its images, named in a 400
    tools: list[dict] | None = None  # the offered tools, OpenAI's shape
    parallel_tool_calls: bool = True
    think: Think = None  # the template's switch (dashboard.api.rules)
    think_param: str = "think"  # the body's field for it, named in a 400
    sampling: dict = field(default_factory=dict)  # the engine's names (rules.sampling)
    priority: Priority = "interactive"  # what the body asks; its key may hold it lower
    keep_alive: float | None = None  # asked (Ollama's); a chat key's is clamped
    num_ctx: int | None = None  # the context per sequence asked (Ollama's options.num_ctx)
    choices: int = 1  # answers to the same prompt (OpenAI's n), each its own sequence


@dataclass(frozen=True, slots=True)
class Ending:
    """How an answer ended, for its Writer's last chunks or its whole object."""

    text: Piece  # what is left to write: the parser's rest, or the whole answer (stream: false)
    calls: list[ToolCall]
    done: dict  # the engine's done event
    figures: dict  # the answer's figures (dashboard.api.figures reads them)

    @property
    def finish_reason(self) -> str:
        return self.done["finish_reason"]

    @property
    def stop(self) -> str | None:
        """The stop sequence that ended the answer, if one did."""
        return self.done.get("stop")


class Answer:
    """A running answer: its Run, the parser of its text, and the model name it answers as."""

    def __init__(self, run: Run, parser: AnswerParser, name: str):
        self.run = run
        self.parser = parser
        self.name = name
        self.has_output = False  # some output has been handed to its Writer

    @property
    def id(self) -> str:
        return self.run.id

    def feed(self, text: str) -> Piece:
        piece = self.parser.feed(text)
        self.has_output = self.has_output or bool(piece)
        return piece

    def end(self, done: dict, before: Piece | None = None) -> Ending:
        """The done event's Ending; `before`, the text not handed over yet (stream: false)."""
        rest, calls = self.parser.finish()
        self.has_output = self.has_output or bool(rest or calls)
        figures = {**self.run.figures(done.get("figures") or {}),
                   "reasoning_tokens": self.parser.thinking_tokens}  # fmt: skip
        return Ending((before or Piece()) + rest, calls, done, figures)

    def take_logprobs(self) -> list[TokenEntry]:
        """The log-probabilities of the tokens whose text is out (dashboard.api.logprobs)."""
        return self.run.take_logprobs()


class Writer(Protocol):
    """A dialect's side of one answer."""

    content_type: str  # of its stream

    def opening(self) -> list[bytes]: ...  # before any output
    def piece(self, piece: Piece) -> list[bytes]: ...  # text that is final
    def ending(self, end: Ending) -> list[bytes]: ...  # the rest, the calls, the end
    def failure(self, error: ApiError) -> list[bytes]: ...  # an error after the stream began
    def final(self, end: Ending) -> dict: ...  # the whole answer as one object (stream: false)


# --- starting an answer -----------------------------------------------------------------------


async def resolve_model(name: str | None) -> LLMModel:
    """Step 1."""
    try:
        return await sync_to_async(resolve)(name or None)
    except UnknownModel as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None


def check_images(model: LLMModel, ask: Ask) -> int:
    """How many images the body sends, once it is known that `model` may take them: a 400 for
    more than MAX_IMAGES, or for a model without a vision projector, naming it."""
    contents = [ask.prompt] if ask.prompt is not None else [m.get("content") for m in
                                                            ask.messages or ()]  # fmt: skip
    count = sum(len(images_of(c)) for c in contents if c is not None)
    if count > MAX_IMAGES:
        raise ApiError(400, f"at most {MAX_IMAGES} images in one request; this one has {count}",
                       param=ask.images_param, code="too_many_images")  # fmt: skip
    if count and not model.takes_images:
        raise ApiError(400, f'"{model.name}" does not take images: it is a text-only model (it '
                       "has no vision projector)", param=ask.images_param,
                       code="model_not_multimodal")  # fmt: skip
    return count


async def render(model: LLMModel, ask: Ask) -> ChatPrompt:
    """Step 2: the prompt of what the body asks (also what count_tokens and /apply-template
    show)."""
    check_images(model, ask)
    if ask.infill is not None:
        check_insert(model, ask.model)
        return ChatPrompt(await infill_prompt(model, ask.infill, tokenize_text), None)
    if ask.prompt is not None:
        return raw_prompt(model, ask.prompt, ask.think)
    return await chat_prompt(model, ask.messages or [], ask.tools, think=ask.think,
                             think_param=ask.think_param)  # fmt: skip


def api_request(model: LLMModel, prompt: Prompt, asked: dict, **fields) -> GenerationRequest:
    """Step 4: the request for an API call (inference.catalog.specs.request_for), its clock
    started when it reached the application (the gate's stamp, appliance.arrival), not now,
    after parsing, authentication and prompt rendering; a sampling value out of bounds (or any
    other field the request refuses) is a 400 naming it."""
    try:
        return request_for(model, prompt, asked, arrived_wall=arrived_wall(), **fields)
    except Refused as exc:
        raise from_refusal(exc) from None


async def start(request: HttpRequest, ask: Ask, *, source: str,
                model: LLMModel | None = None) -> Answer:  # fmt: skip
    """Steps 1 to 5 (`model`: resolved already). `source`: the dialect, for the history."""
    return (await start_choices(request, ask, source=source, model=model))[0]


def _choice_sampling(sampling: dict, index: int) -> dict:
    """The sampling of the index-th choice: a seed asked moves on by one per choice, so that
    choices with a seed differ from each other and still repeat from one request to the next."""
    if index == 0 or sampling.get("seed") is None:
        return sampling
    return {**sampling, "seed": (sampling["seed"] + index) % (SEED_LIMIT + 1)}


async def start_choices(request: HttpRequest, ask: Ask, *, source: str,
                        model: LLMModel | None = None) -> list[Answer]:  # fmt: skip
    """Steps 1 to 5 for `ask.choices` answers to one prompt, each its own request (the engine
    batches them); only the first keeps the conversation's cache key, as only one answer can
    be the conversation's next turn. A refusal of any closes the others."""
    model = model or await resolve_model(ask.model)
    prompt = await render(model, ask)
    return await launch(request, model, ask, prompt, source=source)


async def launch(request: HttpRequest, model: LLMModel, ask: Ask, prompt: ChatPrompt, *,
                 source: str) -> list[Answer]:  # fmt: skip
    """Steps 3 to 5 for a rendered prompt (a llama-server prompt of token ids comes here
    without a template)."""
    sampling = prompt.constrain(ask.sampling, parallel=ask.parallel_tool_calls)
    keep_alive = granted_keep_alive(request.api_key, model, ask.keep_alive)
    caller = caller_fields(request, asked=ask.priority)
    runs = []
    for index in range(ask.choices):
        fields = caller if index == 0 else {**caller, "cache_key": None}
        asked = api_request(model, prompt.prompt, _choice_sampling(sampling, index),
                            keep_alive=keep_alive, **fields)  # fmt: skip
        runs.append(Run(model, asked, source=source, client_name=request.api_key.name,
                        app=app_id(request), min_ctx=context_asked(model, ask.num_ctx)))
    started = await asyncio.gather(*(run.start() for run in runs), return_exceptions=True)
    failed = [result for result in started if isinstance(result, BaseException)]
    if failed:
        await asyncio.gather(*(run.close() for run in runs))
        raise failed[0]
    return [Answer(run, prompt.answer_parser(), ask.model or model.name) for run in runs]


# --- consuming it -----------------------------------------------------------------------------


async def stream(answer: Answer, writer: Writer) -> AsyncIterator[bytes]:
    """The answer's chunks as its Writer writes them (stream: true)."""
    try:
        for chunk in writer.opening():
            yield chunk
        async for event in answer.run.events():
            if event["type"] == "token":
                chunks = writer.piece(answer.feed(event["text"]))
            elif event["type"] == "done":
                chunks = writer.ending(answer.end(event))
            elif event["type"] == "error":
                chunks = writer.failure(from_event(event))
            else:
                continue
            for chunk in chunks:
                yield chunk
                # On the socket now (Django's ASGI handler resumes this generator once the
                # server has written the chunk): its first output is the TTFT.
                if answer.has_output:
                    answer.run.first_output.sent()
    finally:
        await answer.run.close()  # a client that left mid-stream cancels its generation here


async def whole(answer: Answer, writer: Writer) -> dict:
    """The Writer's final object, once the answer has ended (stream: false); an error raises."""
    written = Piece()
    async for event in answer.run.events():
        if event["type"] == "token":
            written += answer.feed(event["text"])
        elif event["type"] == "done":
            return writer.final(answer.end(event, written))
        elif event["type"] == "error":
            raise from_event(event)
    raise from_event(answer.run.final or {})  # (events() always ends with done or error)


async def respond(answer: Answer, writer: Writer, *, streamed: bool) -> HttpResponse:
    if streamed:
        return stream_response(stream(answer, writer), writer.content_type)
    return JsonResponse(await whole(answer, writer))


# --- the prompt's tokens ----------------------------------------------------------------------


async def tokenize_text(
    model: LLMModel, text: str, *, add_special: bool, parse_special: bool = True,
    with_pieces: bool = False, images: tuple[Image, ...] = (),
) -> TokenResult:  # fmt: skip
    """The model's tokens of `text`, from its own tokenizer in its runner process (special
    tokens' text parsed as in a prompt unless `parse_special` is false); with `images` (one per
    media marker), the prompt as its runner reads it, each image's positions as pseudo ids, the
    pictures decoded in its decoder process but not encoded."""
    try:
        return await get_client().tokenize(spec_for(model), text, add_special=add_special,
                                           parse_special=parse_special,
                                           with_pieces=with_pieces, images=images)  # fmt: skip
    except TokenError as exc:
        raise from_event(exc.event) from None


async def count_prompt_tokens(model: LLMModel, prompt: Prompt) -> int:
    """The prompt tokens a generation of `prompt` would have (its BOS rule included, its
    images as many as the projector reads each as); a picture that does not decode is the 400
    a generation's would be."""
    result = await tokenize_text(model, prompt.text, add_special=prompt.add_special,
                                 images=prompt.media)  # fmt: skip
    return len(result.tokens)
