"""OpenAI's Responses API: POST /v1/responses, stateless (dashboard.api.responses.schemas).

The request takes chat completions' path through the answer pipeline (dashboard.api.pipeline):
its input becomes chat messages with its tools and thinking switch, its text.format the grammar
response_format would give. What differs is the shape: output items and named stream events
(dashboard.api.responses.events). A refusal is an HTTP error before the stream begins; an error
after it has begun is an `error` event followed by `response.failed`.
"""

from django.conf import settings
from django.http import HttpRequest

from dashboard.api import pipeline
from dashboard.api.answer_parser import Piece
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import parse_body
from dashboard.api.errors import ApiError
from dashboard.api.pipeline import Answer, Ending
from dashboard.api.responses.events import ResponseBuilder
from dashboard.api.responses.schemas import ResponsesRequest
from dashboard.api.streaming import sse_event


class ResponsesWriter:
    content_type = "text/event-stream"

    def __init__(self, answer: Answer, body: ResponsesRequest):
        self.builder = ResponseBuilder(f"resp_{answer.id}", answer.name, body)

    def opening(self) -> list[bytes]:
        return [sse_event(event) for event in self.builder.opening()]

    def piece(self, piece: Piece) -> list[bytes]:
        return [sse_event(event) for event in self.builder.piece(piece)]

    def ending(self, end: Ending) -> list[bytes]:
        return [sse_event(event) for event in self.builder.finish(end)]

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse_event(event) for event in self.builder.fail(error)]

    def final(self, end: Ending) -> dict:
        self.builder.finish(end)
        return self.builder.response()


@api_endpoint(dialect="openai", methods=("POST",), max_body=settings.MAX_IMAGE_BODY_BYTES)
async def responses(request: HttpRequest):
    body = parse_body(request, ResponsesRequest)
    answer = await pipeline.start(request, body.ask(), source="openai")
    return await pipeline.respond(answer, ResponsesWriter(answer, body), streamed=body.stream)
