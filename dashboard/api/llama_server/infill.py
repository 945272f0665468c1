"""llama-server's /infill: code completion for editors (llama.vscode, llama.vim, Qt Creator).

The body is llama-server's: `input_prefix` and `input_suffix` (the code around the cursor),
`prompt` (the current line's start), `input_extra` (other files' chunks, {filename, text}) and
llama-server's sampling and stopping fields (dashboard.api.llama_server.sampling), which
/completion shares. The prompt is laid out as llama-server lays it out (inference.text.infill,
through dashboard.api.fim), so the same request reads the same tokens; it runs on the one
answer pipeline (dashboard.api.pipeline) as interactive work unless its key is held lower, so it
never waits behind a background flood, and its prefix is reused from the prompt cache when an
earlier request in the same partition read the same tokens.

The answer is llama-server's, as /completion's (dashboard.api.llama_server.answer, which also
applies n_predict 0, the time limits and n_indent as it reads it).
"""

from typing import Annotated

from django.http import HttpRequest, HttpResponse
from pydantic import Field, model_validator

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import MAX_PROMPT_CHARS, PromptText, Strict, parse_body
from dashboard.api.errors import ApiError
from dashboard.api.llama_server.answer import Reading
from dashboard.api.llama_server.sampling import LlamaSampling
from inference.text.infill import DEFAULT_FILENAME, ExtraChunk, InfillText

post = api_endpoint(dialect="openai", methods=("POST",))

MAX_EXTRA_CHUNKS = 256  # llama.vscode keeps 16 by default (ring_n_chunks), llama.vim 64


class ExtraChunkBody(Strict):
    text: PromptText
    filename: Annotated[str, Field(max_length=1024)] = DEFAULT_FILENAME


class InfillRequest(LlamaSampling):
    input_prefix: PromptText
    input_suffix: PromptText
    input_extra: Annotated[list[ExtraChunkBody], Field(max_length=MAX_EXTRA_CHUNKS)] = []
    prompt: PromptText = ""

    @model_validator(mode="after")
    def _bounded(self) -> "InfillRequest":
        chars = len(self.input_prefix) + len(self.input_suffix) + len(self.prompt) + sum(
            len(chunk.text) + len(chunk.filename) for chunk in self.input_extra)  # fmt: skip
        if chars > MAX_PROMPT_CHARS:
            raise ValueError(f"the texts are {chars} characters together, over "
                             f"{MAX_PROMPT_CHARS}")  # fmt: skip
        return self

    def ask(self) -> pipeline.Ask:
        extra = tuple(ExtraChunk(chunk.text, chunk.filename) for chunk in self.input_extra)
        text = InfillText(self.input_prefix, self.input_suffix, self.prompt, extra)
        return pipeline.Ask(model=self.model, infill=text, sampling=self.sampling())


@post
async def infill(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, InfillRequest)
    model = await pipeline.resolve_model(body.model)
    if not model.fills_in_middle:
        missing = " ".join(f"{name} token is missing." for role, name in
                           (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
                           if role not in model.fim_tokens)  # fmt: skip
        raise ApiError(400, f"Infill is not supported by this model: {missing} (\"{model.name}\" "
                       "has no fill-in-the-middle tokens)", param="model",
                       code="insert_not_supported")  # fmt: skip
    answer = await pipeline.start(request, body.ask(), source="llama-server", model=model)
    return await Reading(answer, body).respond()
