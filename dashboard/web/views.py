"""The pages: chat (a user's own conversations only) and the staff dashboard.

Both are a server-rendered shell plus one script; live content comes over WebSockets
(dashboard.consumers). Data for the scripts is embedded with json_script, never as markup.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from dashboard.chat import images, running, turn_request, turns
from dashboard.models import Conversation
from dashboard.web.security import staff_required, with_csp
from inference.catalog.lookup import default_model
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import MIME_TYPES
from inference.history import recent_requests
from inference.models import LLMModel
from inference.serving.client import get_client

SIDEBAR_CONVERSATIONS = 200
MAX_SEARCH_CHARS = 200


@never_cache
@login_required
@with_csp
@require_GET
def chat_page(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    conversation = None
    if conversation_id is not None:
        # Someone else's conversation is a 404, the same as one that does not exist.
        conversation = get_object_or_404(Conversation, pk=conversation_id, user=request.user)
    registered = list(LLMModel.objects.order_by("-is_default", "name"))
    models = [model.name for model in registered]
    default = default_model()
    data = {
        "conversation": None,
        "messages": [],
        "context_start": None,
        "models": models,
        # Tokens per sequence, for the page's token counter.
        "contexts": {model.name: turn_request.context_of(model) for model in registered},
        "model": default.name if default else None,
        "max_content_chars": turns.MAX_CONTENT_CHARS,
        "max_system_prompt_chars": turns.MAX_SYSTEM_PROMPT_CHARS,
        # Attaching pictures: offered for the models that take them, within these bounds.
        "vision_models": [m.name for m in registered if m.takes_images],
        "max_images": MAX_IMAGES,
        "max_image_bytes": images.MAX_IMAGE_BYTES,
        "image_types": sorted(MIME_TYPES),
        "image_tokens": turn_request.IMAGE_TOKENS_ESTIMATE,  # the counter's estimate per image
    }
    if conversation is not None:
        data["conversation"] = {
            "id": conversation.pk,
            "title": conversation.title,
            "model": conversation.model_name,
            "system_prompt": conversation.system_prompt,
        }
        data.update(turns.branch_data(conversation))
        if conversation.model_name in models:
            data["model"] = conversation.model_name
    conversations = Conversation.objects.filter(user=request.user).only("pk", "title")
    query = " ".join(request.GET.get("q", "").split())[:MAX_SEARCH_CHARS]
    if query:  # titles and what was said, this user's own only
        conversations = conversations.filter(
            Q(title__icontains=query) | Q(messages__content__icontains=query)
        ).distinct()
    return render(request, "chat/chat.html", {
        "conversation": conversation,
        "conversations": conversations[:SIDEBAR_CONVERSATIONS],
        "query": query,
        "chat_data": data,
    })  # fmt: skip


@login_required
@require_POST
def delete_conversation(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=conversation_id, user=request.user)
    if running.is_active(conversation.pk):
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
            "mode": get_client().mode,
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
