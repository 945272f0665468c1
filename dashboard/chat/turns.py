"""One chat turn, from a browser's frame to a saved answer.

The steps (the consumer calls 1 and 2, and stops, attaches and detaches through Turn):
1. prepare_send / prepare_edit / prepare_regenerate / prepare_continue (sync, in a thread):
   check the user and the conversation, build the message list (system prompt first, then the
   turns that fit the context: dashboard.chat.window) and render it with the model's chat
   template, and only then persist: the user message and an assistant message in state
   "streaming" (Continue writes on into the answer it continues). A refusal raises ChatRefused
   and changes nothing.
2. start / run_turn (dashboard.chat.running; async, a task of its own): stream the
   generation through the inference client, publishing phases, progress and tokens to whichever
   sockets are attached, saving the partial answer every few seconds, and at the end saving the
   content, state, figures and a RequestRecord, before the final frame goes out.

A turn belongs to its conversation, not to a socket: a socket that goes away (a reload, a
phone locking) only detaches, the answer runs on to its end (its length limit bounds it) as
background work while nobody watches, and a new socket of the same user attaches and gets the
text so far, then the rest live (interactive again). Stop still cancels. Running answers per
user are capped (dashboard.limits.chat_answers).
"""

import time
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction

from appliance.arrival import arrived_wall
from dashboard.chat import ChatRefused, images, turn_request
from dashboard.chat.running import Claim, Turn, is_active, register
from dashboard.models import ChatImage, Conversation, Message, newest_leaf, versions
from inference.catalog.lookup import UnknownModel, resolve
from inference.catalog.specs import spec_for
from inference.models import LLMModel

MAX_CONTENT_CHARS = 100_000  # a long paste; the context's token limit is checked by the engine
MAX_SYSTEM_PROMPT_CHARS = 8_000
MAX_MODEL_NAME_CHARS = 100
MAX_TITLE_CHARS = 200  # Conversation.title's column
TITLE_CHARS = 60

# --- 1. preparing a turn (sync: runs in a thread) ------------------------------------------------


def _arrived() -> float:
    """When the frame asking for this turn reached the socket (ChatConsumer stamps it): the
    turn's clock starts there, before the checks and the prompt's rendering."""
    return arrived_wall() or time.time()


def _check_user(user_id: int, session: SessionBase | None) -> object:
    """The user again, from the database: a socket outlives a logout, an expired session or a
    deactivation, and each of those must end its chat too."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        raise ChatRefused("unauthorized", "your account is not active")
    key = session.session_key if session is not None else None
    # A fresh read of the stored session: load() gives {} for one deleted or expired.
    store = import_module(settings.SESSION_ENGINE).SessionStore
    stored = store(session_key=key).load() if key else {}
    if str(stored.get(SESSION_KEY)) != str(user_id):
        raise ChatRefused("unauthorized", "you have been logged out; log in again")
    return user


def own_conversation(user, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(pk=conversation_id, user=user).first()
    if conversation is None:  # someone else's reads the same as a missing one
        raise ChatRefused("not_found", "no such conversation")
    return conversation


def _model(name: str | None) -> LLMModel:
    try:
        return resolve(name or None)
    except UnknownModel as exc:
        raise ChatRefused("unknown_model", str(exc)) from None


def _title(content: str) -> str:
    line = " ".join(content.split()) or "Image"  # a question may be pictures alone
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def _open_answer(conversation, parent, model, request) -> Message:
    return Message.objects.create(
        conversation=conversation, parent=parent, role=Message.Role.ASSISTANT,
        state=Message.State.STREAMING, request_id=request.request_id, model_name=model.name,
    )  # fmt: skip


def _turn(
    conversation, user, model, request, prompt: turn_request.Prompt, answer, *, kind: str,
    user_message_id: int | None = None, replaced_message_id: int | None = None,
    truncate_from: int | None = None, prefix: str = "", prefix_tokens: int = 0,
) -> Turn:  # fmt: skip
    return Turn(
        conversation_id=conversation.pk, user_id=user.pk, title=conversation.title,
        model_name=model.name, message_id=answer.pk, user_message_id=user_message_id,
        replaced_message_id=replaced_message_id, truncate_from=truncate_from,
        username=user.get_username(), request=request, spec=spec_for(model), kind=kind,
        prefix=prefix, prefix_tokens=prefix_tokens, left_out=prompt.left_out,
        context_start=prompt.context_start, splitter=prompt.rendered.splitter(),
    )  # fmt: skip


def _save_window(conversation: Conversation, prompt: turn_request.Prompt) -> None:
    conversation.context_start_id = prompt.context_start
    conversation.save(update_fields=["context_start", "model_name", "system_prompt", "leaf",
                                     "updated_at"])  # fmt: skip


def _ask(
    user,
    conversation: Conversation | None,
    *,
    parent_of_question,
    earlier,
    content,
    pictures: list[ChatImage],
    model,
    system_prompt,
    arrived,
    kind,
    truncate_from=None,
) -> Turn:
    """A new question and its answer, under `parent_of_question` (shared by send and edit);
    `pictures`: the question's images, in order (dashboard.chat.images.chosen)."""
    prompt = turn_request.build(model, conversation, system_prompt, earlier,
                               [{"role": "user", "content": content,
                                 "images": pictures}])  # fmt: skip
    claim = Claim(user.pk)
    try:
        with transaction.atomic():
            if conversation is None:
                conversation = Conversation.objects.create(
                    user=user, title=_title(content), model_name=model.name,
                    system_prompt=system_prompt,
                )  # fmt: skip
            claim.take(conversation.pk)
            request = turn_request.answer_request(model, prompt, conversation, arrived)
            asked = Message.objects.create(conversation=conversation, parent=parent_of_question,
                                           role=Message.Role.USER, content=content)  # fmt: skip
            images.attach(pictures, asked)
            answer = _open_answer(conversation, asked, model, request)
            conversation.model_name = model.name
            conversation.system_prompt = system_prompt
            conversation.leaf = answer
            _save_window(conversation, prompt)
            turn = _turn(
                conversation,
                user,
                model,
                request,
                prompt,
                answer,
                user_message_id=asked.pk,
                truncate_from=truncate_from,
                kind=kind,
            )
    except BaseException:
        claim.drop()
        raise
    register(turn)
    return turn


@dataclass(slots=True)
class SendInputs:
    """What a send starts from: its user, conversation (None: a new one), model, system prompt
    and the branch on show (oldest first)."""

    user: object
    conversation: Conversation | None
    model: LLMModel
    system_prompt: str
    branch: list[Message]


def send_inputs(
    user_id: int, session: SessionBase | None, *, conversation_id: int | None,
    model_name: str | None, system_prompt: str | None,
) -> SendInputs:  # fmt: skip
    """The checks and reads of a send (the token counter's too, dashboard.chat.counting): the
    frame's model, else the conversation's; its system prompt, else the conversation's."""
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id) if conversation_id else None
    model = _model(model_name or (conversation.model_name if conversation else None))
    if system_prompt is None:
        system_prompt = conversation.system_prompt if conversation else ""
    branch = []
    if conversation is not None:
        conversation.adopt_linear()
        branch = conversation.path()
    return SendInputs(user, conversation, model, system_prompt, branch)


def prepare_send(
    user_id: int,
    session: SessionBase | None,
    *,
    conversation_id: int | None,
    content: str,
    model_name: str | None,
    system_prompt: str | None,
    image_ids: list[int] = (),
) -> Turn:
    """`image_ids`: the question's pictures, attachments waiting to be sent (POST /chat/images/),
    in the order they were attached."""
    arrived = _arrived()
    asked = send_inputs(user_id, session, conversation_id=conversation_id, model_name=model_name,
                        system_prompt=system_prompt)  # fmt: skip
    branch = asked.branch
    pictures = images.chosen(asked.user, image_ids, asked.conversation)
    return _ask(asked.user, asked.conversation, parent_of_question=branch[-1] if branch else None,
                earlier=branch, content=content, pictures=pictures, model=asked.model,
                system_prompt=asked.system_prompt, arrived=arrived, kind="send")  # fmt: skip


def prepare_edit(
    user_id: int, session: SessionBase | None, *, conversation_id: int, message_id: int,
    content: str, image_ids: list[int] | None = None,
) -> Turn:  # fmt: skip
    """Ask an edited version of one of the branch's questions: a sibling of the old one, so the
    old question and everything after it stay as a version to flip back to. It keeps the old
    question's images, or with `image_ids` has those: some of them (the others removed), and
    new attachments."""
    arrived = _arrived()
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    index = next((i for i, m in enumerate(branch) if m.pk == message_id), None)
    if index is None or branch[index].role != Message.Role.USER:
        raise ChatRefused("not_found", "no such question in this conversation")
    edited = branch[index]
    model = _model(conversation.model_name)
    if image_ids is None:
        pictures = list(edited.images.all())
    else:
        pictures = images.chosen(user, image_ids, conversation)
    return _ask(user, conversation, parent_of_question=edited.parent, earlier=branch[:index],
                content=content, pictures=pictures, model=model,
                system_prompt=conversation.system_prompt, arrived=arrived, kind="edit",
                truncate_from=edited.pk)  # fmt: skip


def prepare_regenerate(user_id: int, session: SessionBase | None, *, conversation_id: int) -> Turn:
    """A new answer to the branch's last question; the one it replaces stays as a version (or
    answer a last, unanswered question)."""
    arrived = _arrived()
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    replaced = branch[-1] if branch and branch[-1].role == Message.Role.ASSISTANT else None
    earlier = branch[:-1] if replaced else branch
    if not earlier or earlier[-1].role != Message.Role.USER:
        raise ChatRefused("nothing_to_regenerate", "there is no question to answer again")
    question = earlier[-1]
    model = _model(conversation.model_name)
    prompt = turn_request.build(model, conversation, conversation.system_prompt, earlier[:-1],
                               [turn_request.question(question)])  # fmt: skip
    claim = Claim(user.pk)
    try:
        with transaction.atomic():
            claim.take(conversation.pk)
            request = turn_request.answer_request(model, prompt, conversation, arrived)
            answer = _open_answer(conversation, question, model, request)
            conversation.model_name = model.name
            conversation.leaf = answer
            _save_window(conversation, prompt)
            turn = _turn(conversation, user, model, request, prompt, answer, kind="regenerate",
                         replaced_message_id=replaced.pk if replaced else None)  # fmt: skip
    except BaseException:
        claim.drop()
        raise
    register(turn)
    return turn


def prepare_continue(user_id: int, session: SessionBase | None, *, conversation_id: int) -> Turn:
    """Write on from the branch's last answer: the prompt is the conversation with that answer
    as the assistant's unfinished turn, and what the model writes is appended to it."""
    arrived = _arrived()
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    answer = branch[-1] if branch else None
    if (len(branch) < 2 or branch[-1].role != Message.Role.ASSISTANT or not answer.content
            or branch[-2].role != Message.Role.USER):  # fmt: skip
        raise ChatRefused("nothing_to_continue", "there is no answer to continue")
    question = branch[-2]
    model = _model(answer.model_name or conversation.model_name)
    prompt = turn_request.build(model, conversation, conversation.system_prompt, branch[:-2],
                               [turn_request.question(question),
                                {"role": "assistant", "content": answer.content}],
                               partial=answer.content)  # fmt: skip
    claim = Claim(user.pk)
    try:
        with transaction.atomic():
            claim.take(conversation.pk)
            request = turn_request.answer_request(model, prompt, conversation, arrived)
            Message.objects.filter(pk=answer.pk).update(
                state=Message.State.STREAMING, error="", request_id=request.request_id,
                model_name=model.name,
            )  # fmt: skip
            conversation.model_name = model.name
            _save_window(conversation, prompt)
            turn = _turn(conversation, user, model, request, prompt, answer, kind="continue",
                         prefix=answer.content,
                         prefix_tokens=turn_request.answer_tokens(answer))  # fmt: skip
    except BaseException:
        claim.drop()
        raise
    register(turn)
    return turn


# --- conversations: the branch on show, versions, rename -------------------------------------


def message_data(message: Message, messages: list[Message]) -> dict:
    """A message as the page gets it (the page's initial data and a switch's reply)."""
    state, error = message.state, message.error
    if state == Message.State.STREAMING and not is_active(message.conversation_id):
        # Left "streaming" by a process that ended mid-answer: it will never finish.
        state, error = Message.State.STOPPED, "interrupted: the appliance restarted"
    figures = message.figures or {}
    siblings = versions(message, messages)
    return {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "thinking": message.thinking,
        "state": state,
        "error": error,
        "model": message.model_name,
        "figures": {key: figures.get(key) for key in FIGURE_KEYS if key in figures},
        "versions": [m.pk for m in siblings],
        "images": [images.as_page(image) for image in message.images.all()],
    }


# The figures a saved answer shows (static/js/chat_figures.js); the rest of what was saved (the
# timeline, ITL percentiles) stays in the message and the request history. cached_by_tier and
# restore_time: where the cached tokens came from (warm memory); drafted and draft_accepted:
# speculation; encode_time and image_tokens: reading its images.
FIGURE_KEYS = (
    "ttft", "prompt_tps", "decode_tps", "prompt_tokens", "cached_tokens", "output_tokens",
    "queue_time", "load_time", "prefill_time", "total_time", "finish_reason", "answer_tokens",
    "thinking_s", "cached_by_tier", "restore_time", "drafted", "draft_accepted",
    "encode_time", "image_tokens", "images_encoded", "images_cached",
)  # fmt: skip


def branch_data(conversation: Conversation) -> dict:
    messages = list(conversation.messages.prefetch_related("images"))
    branch = conversation.path(messages)
    # Saved before versions (no leaf): one line of messages, each its only version.
    versioned = conversation.leaf_id is not None
    return {"messages": [message_data(m, messages if versioned else [m]) for m in branch],
            "context_start": conversation.context_start_id}  # fmt: skip


def switch_version(user_id: int, session, *, conversation_id: int, message_id: int) -> dict:
    """Show another version of a turn: the newest branch under it becomes the one on show."""
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    if is_active(conversation.pk):
        raise ChatRefused("busy", "an answer is still streaming; stop it first")
    conversation.adopt_linear()
    messages = list(conversation.messages.all())
    target = next((m for m in messages if m.pk == message_id), None)
    if target is None:
        raise ChatRefused("not_found", "no such message in this conversation")
    conversation.leaf = newest_leaf(target, messages)
    conversation.save(update_fields=["leaf"])
    return {"type": "branch", "id": conversation.pk, **branch_data(conversation)}


def rename(user_id: int, session, *, conversation_id: int, title: str) -> dict:
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.title = " ".join(title.split())[:MAX_TITLE_CHARS] or conversation.title
    conversation.save(update_fields=["title"])
    return {"type": "renamed", "id": conversation.pk, "title": conversation.title}


def check_attach(user_id: int, session, *, conversation_id: int) -> dict:
    """Only the conversation's owner may watch its answer; returns the branch as saved, for
    when nothing runs any more."""
    conversation = own_conversation(_check_user(user_id, session), conversation_id)
    return branch_data(conversation)
