"""OpenAI's Responses API: POST /v1/responses, stateless (dashboard.api.responses_schemas).

The request takes chat completions' path: its input becomes chat messages, rendered through the
model's template with its tools and thinking switch (dashboard.api.prompts), its text.format
becomes the grammar response_format would; the answer is split by the same AnswerParser. What
differs is the shape: output items and named stream events (dashboard.api.responses_events).
A refusal is an HTTP error before the stream begins; an error after it has begun is an `error`
event followed by `response.failed`.
"""

from collections.abc import AsyncIterator

from django.http import HttpRequest, JsonResponse

from dashboard.api.auth import api_endpoint, app_id, caller_fields
from dashboard.api.errors import from_event
from dashboard.api.prompts import chat_prompt
from dashboard.api.responses_events import ResponseBuilder
from dashboard.api.responses_schemas import ResponsesRequest
from dashboard.api.runs import Run, api_request, resolve_model
from dashboard.api.schemas import parse_body
from dashboard.api.streaming import sse_event, stream_response


@api_endpoint(dialect="openai", methods=("POST",))
async def responses(request: HttpRequest):
    body = parse_body(request, ResponsesRequest)
    model = await resolve_model(body.model)
    prompt = await chat_prompt(model, body.messages(), body.active_tools, think=body.think,
                               think_param="reasoning")  # fmt: skip
    sampling = prompt.constrain(body.sampling(), parallel=body.parallel_tool_calls is not False)
    asked = api_request(model, prompt.prompt, sampling,
                        **caller_fields(request, asked=body.priority))  # fmt: skip
    run = Run(model, asked, source="openai", client_name=request.api_key.name,
              app=app_id(request))  # fmt: skip
    await run.start()
    builder = ResponseBuilder(f"resp_{run.id}", body.model or model.name, body,
                              prompt.answer_parser())  # fmt: skip
    if body.stream:
        return stream_response(_events(run, builder), "text/event-stream")
    async for event in run.events():
        if event["type"] == "token":
            builder.feed(event["text"])
        elif event["type"] == "done":
            builder.finish(event)
        elif event["type"] == "error":
            raise from_event(event)
    return JsonResponse(builder.response())


async def _events(run: Run, builder: ResponseBuilder) -> AsyncIterator[bytes]:
    try:
        for event in builder.opening():
            yield sse_event(event)
        async for event in run.events():
            if event["type"] == "token":
                made = builder.feed(event["text"])
            elif event["type"] == "done":
                made = builder.finish(event)
            elif event["type"] == "error":
                made = builder.fail(from_event(event))
            else:
                continue
            for made_event in made:
                yield sse_event(made_event)
    finally:
        await run.close()  # a client that left mid-stream cancels its generation here
