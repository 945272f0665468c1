"""The pages: chat (a user's own conversations only) and the staff dashboard.

Both are a server-rendered shell plus one script; live content comes over WebSockets
(dashboard.consumers). Data for the scripts is embedded with json_script, never as markup.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from dashboard import chat
from dashboard.models import Conversation, Message
from dashboard.web.security import staff_required, with_csp
from inference.history import recent_requests
from inference.models import LLMModel
from inference.registry import default_model

FIGURE_KEYS = (
    "ttft", "prompt_tps", "decode_tps", "prompt_tokens", "cached_tokens", "output_tokens",
    "queue_time", "load_time", "prefill_time", "total_time", "finish_reason",
)  # fmt: skip
SIDEBAR_CONVERSATIONS = 200


def message_data(message: Message) -> dict:
    state, error = message.state, message.error
    if state == Message.State.STREAMING and not chat.is_active(message.conversation_id):
        # Left "streaming" by a process that died mid-answer: it will never finish.
        state, error = Message.State.STOPPED, "interrupted: the appliance restarted"
    figures = message.figures or {}
    return {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "state": state,
        "error": error,
        "figures": {key: figures.get(key) for key in FIGURE_KEYS if key in figures},
    }


@never_cache
@login_required
@with_csp
@require_GET
def chat_page(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    conversation = None
    if conversation_id is not None:
        # Someone else's conversation is a 404, the same as one that does not exist.
        conversation = get_object_or_404(Conversation, pk=conversation_id, user=request.user)
    models = list(LLMModel.objects.order_by("-is_default", "name").values_list("name", flat=True))
    default = default_model()
    data = {
        "conversation": None,
        "messages": [],
        "models": models,
        "model": default.name if default else None,
        "max_content_chars": chat.MAX_CONTENT_CHARS,
        "max_system_prompt_chars": chat.MAX_SYSTEM_PROMPT_CHARS,
    }
    if conversation is not None:
        data["conversation"] = {
            "id": conversation.pk,
            "title": conversation.title,
            "model": conversation.model_name,
            "system_prompt": conversation.system_prompt,
        }
        data["messages"] = [message_data(m) for m in conversation.messages.all()]
        if conversation.model_name in models:
            data["model"] = conversation.model_name
    conversations = Conversation.objects.filter(user=request.user).only("pk", "title")
    return render(request, "chat/chat.html", {
        "conversation": conversation,
        "conversations": conversations[:SIDEBAR_CONVERSATIONS],
        "chat_data": data,
    })  # fmt: skip


@login_required
@require_POST
def delete_conversation(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=conversation_id, user=request.user)
    if chat.is_active(conversation.pk):
        return HttpResponse("this conversation is answering; stop it first", status=409)
    conversation.delete()
    return redirect("chat")


@never_cache
@staff_required
@with_csp
@require_GET
def dashboard_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/dashboard.html", {
        "dashboard_data": {
            "interval_s": settings.TELEMETRY_INTERVAL_S,
            "retention_days": settings.REQUEST_RETENTION_DAYS,
            "itl_target_ms": settings.ITL_TARGET_MS,
            "mode": "split" if settings.SPLIT_MODE else "embedded",
            "requests": recent_requests(),
        },
    })  # fmt: skip


@never_cache
@staff_required
@require_GET
def recent_requests_json(request: HttpRequest) -> JsonResponse:
    try:
        limit = int(request.GET.get("limit", 50))
    except ValueError:
        limit = 50
    return JsonResponse({"requests": recent_requests(limit)})
