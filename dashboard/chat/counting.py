"""The composer's token counter: how many tokens the prompt of a send would have now, counted by
the model's own tokenizer, and the context it goes into.

1. (sync, in a thread) The user, conversation and model a send would have, and the prompt it
   would build: the system prompt, the turns the window keeps, the message being written,
   through the model's template (dashboard.chat.turns.send_inputs,
   dashboard.chat.turn_request.build).
   Nothing is saved.
2. The model's runner counts the prompt's tokens, its BOS rule included, so the count is the
   `prompt_tokens` the answer would report; only when the model is loaded already: counting
   never loads a model, nor keeps one loaded longer (inference.serving.tokens, `if_loaded`).
   Otherwise, when counting fails, or when the prompt holds images (the tokenizer would count
   their markers, not their tokens), the reply has no count and the page shows its estimate,
   marked "≈".
"""

from dataclasses import dataclass
from typing import Literal, TypedDict

from channels.db import database_sync_to_async
from django.contrib.sessions.backends.base import SessionBase

from dashboard.chat import ChatRefused, turn_request
from dashboard.chat.turns import send_inputs
from inference.catalog.specs import spec_for
from inference.engine.host import ModelSpec
from inference.serving.client import get_client
from inference.serving.tokens import TokenError


@dataclass(slots=True, frozen=True)
class CountAsk:
    """A "count" frame: what the composer holds now; `seq` numbers the page's asks."""

    seq: int
    conversation_id: int | None
    content: str
    model_name: str | None
    system_prompt: str | None


class CountReply(TypedDict):
    type: Literal["count"]
    seq: int
    tokens: int | None  # None: not counted (the model is not loaded, or the count failed)
    # Tokens per sequence the model gets (dashboard.chat.turn_request.context_of).
    context: int | None
    left_out: int  # earlier messages the window leaves out of this prompt


def _build(
    user_id: int, session: SessionBase | None, ask: CountAsk
) -> tuple[ModelSpec, turn_request.Prompt, int]:
    """Step 1: the model's runner spec, the prompt, and the model's context."""
    asked = send_inputs(user_id, session, conversation_id=ask.conversation_id,
                        model_name=ask.model_name, system_prompt=ask.system_prompt)  # fmt: skip
    prompt = turn_request.build(asked.model, asked.conversation, asked.system_prompt, asked.branch,
                               [{"role": "user", "content": ask.content}])  # fmt: skip
    return spec_for(asked.model), prompt, turn_request.context_of(asked.model)


def uncounted(seq: int) -> CountReply:
    return {"type": "count", "seq": seq, "tokens": None, "context": None, "left_out": 0}


async def count(user_id: int, session: SessionBase | None, ask: CountAsk) -> CountReply:
    reply = uncounted(ask.seq)
    try:
        # A thread of its own, as a send's preparation: a template render may take seconds.
        spec, prompt, context = await database_sync_to_async(_build, thread_sensitive=False)(
            user_id, session, ask
        )
    except ChatRefused:  # the send itself would say why; the counter just has no count
        return reply
    reply.update(context=context, left_out=prompt.left_out)
    if prompt.media:  # the tokenizer would count a marker, not the image: the page estimates
        return reply
    try:
        counted = await get_client().tokenize(spec, prompt.text,
                                              add_special=prompt.rendered.add_special,
                                              if_loaded=True)  # fmt: skip
    except TokenError:
        return reply
    reply["tokens"] = len(counted.tokens)
    return reply
