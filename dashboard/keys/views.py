"""The API keys page (/api-keys/): staff create and revoke the keys home apps use, and set
each key's priority (interactive, or background for an app working through a batch).

A new key is shown once, in the response to the form that created it, and never stored: the
database keeps only its hash and a prefix to tell keys apart. Beside it: a copy button and
examples ready to paste, filled with this box's address (the host the browser used) and the
new key. Revoking asks first, on a page of its own, so it works without JavaScript.
"""

import json
from typing import NamedTuple

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.models import ApiKey
from dashboard.web.security import staff_required, with_csp
from inference.catalog.lookup import default_model

KEY_PLACEHOLDER = "YOUR_KEY"
MODEL_PLACEHOLDER = "MODEL"


class ApiKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="the home app that will use it, e.g. home-assistant"
    )
    scope = forms.ChoiceField(
        choices=ApiKey.Scope.choices, initial=ApiKey.Scope.CHAT,
        help_text="each scope includes the ones above it; Home Assistant and Open WebUI need "
        "only chat",
    )  # fmt: skip

    priority = forms.ChoiceField(
        choices=ApiKey.Priority.choices, initial=ApiKey.Priority.INTERACTIVE, required=False,
        help_text="background: the app's answers wait while people are answered, and its "
        "requests can ask for nothing higher; for taggers, indexers and batch scripts",
    )  # fmt: skip

    household = forms.SlugField(
        max_length=40, required=False,
        help_text="optional: keys with the same household share cached prompts (a long common "
        "system prompt is then read once for all of them); empty keeps this app's cache its own",
    )  # fmt: skip

    def clean_priority(self) -> str:
        return self.cleaned_data["priority"] or ApiKey.Priority.INTERACTIVE  # not sent: default

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if ApiKey.objects.filter(name=name).exists():
            raise forms.ValidationError("a key with this name exists already")
        return name


class PriorityForm(forms.Form):
    """A key's priority, changed from its row in the table."""

    priority = forms.ChoiceField(choices=ApiKey.Priority.choices)


class Example(NamedTuple):
    slug: str  # the element id
    title: str
    text: str


def examples(base_url: str, key: str, model: str) -> list[Example]:
    """What a home app needs, ready to paste: the same request in each dialect the LAN API
    speaks, and the official clients as their documentation sets them up."""
    base = base_url.rstrip("/")
    chat = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}]})
    ollama_chat = json.dumps({
        "model": model, "messages": [{"role": "user", "content": "Hello!"}], "stream": False,
    })  # fmt: skip
    return [
        Example("curl-openai", "curl, OpenAI dialect", (
            f"curl {base}/v1/chat/completions \\\n"
            f'  -H "Authorization: Bearer {key}" \\\n'
            f'  -H "Content-Type: application/json" \\\n'
            f"  -d '{chat}'"
        )),
        Example("curl-ollama", "curl, Ollama dialect", (
            f"curl {base}/api/chat \\\n"
            f'  -H "Authorization: Bearer {key}" \\\n'
            f"  -d '{ollama_chat}'"
        )),
        Example("python-openai", "Python, the openai client", (
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
            "answer = client.chat.completions.create(\n"
            f'    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}]\n'
            ")\n"
            "print(answer.choices[0].message.content)"
        )),
        Example("python-ollama", "Python, the ollama client", (
            "from ollama import Client\n\n"
            f'client = Client(host="{base}", headers={{"Authorization": "Bearer {key}"}})\n'
            f'answer = client.chat(model="{model}", messages=[{{"role": "user", "content": '
            '"Hello!"}])\n'
            "print(answer.message.content)"
        )),
    ]  # fmt: skip


def _page(request: HttpRequest, form: ApiKeyForm, new_key: str | None = None,
          status: int = 200) -> HttpResponse:  # fmt: skip
    base_url = request.build_absolute_uri("/")  # the address this browser reached the box at
    model = default_model()
    model_name = model.name if model else MODEL_PLACEHOLDER
    key = new_key or KEY_PLACEHOLDER
    return render(request, "keys/keys.html", {
        "form": form,
        "keys": ApiKey.objects.all(),
        "priorities": ApiKey.Priority.choices,
        "new_key": new_key,
        "base_url": base_url,
        "base": base_url.rstrip("/"),
        "example_key": key,
        "model_name": model_name,
        "examples": examples(base_url, key, model_name),
    }, status=status)  # fmt: skip


@never_cache
@staff_required
@with_csp
@require_http_methods(["GET", "POST"])
def keys_page(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request, ApiKeyForm())
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    key, raw = ApiKey.create(form.cleaned_data["name"], form.cleaned_data["scope"],
                             household=form.cleaned_data["household"],
                             priority=form.cleaned_data["priority"])  # fmt: skip
    # Rendered, not redirected: the raw key must not pass through the session or a URL.
    return _page(request, ApiKeyForm(), new_key=raw)


@never_cache
@staff_required
@with_csp
@require_POST
def revoke_key(request: HttpRequest, key_id: int) -> HttpResponse:
    """The table's Revoke button asks first (a confirmation page); the page's own button,
    which sends confirm=yes, revokes."""
    key = get_object_or_404(ApiKey, pk=key_id)
    if key.revoked:
        return redirect("api_keys")
    if request.POST.get("confirm") != "yes":
        return render(request, "keys/revoke_confirm.html", {"key": key})
    key.revoked = True
    key.save(update_fields=["revoked"])
    messages.success(request, f"the key {key.name} is revoked: apps using it are refused now")
    return redirect("api_keys")


@never_cache
@staff_required
@with_csp
@require_POST
def set_key_priority(request: HttpRequest, key_id: int) -> HttpResponse:
    """A key's priority from its row: requests that arrive from now on run at it (those
    running keep theirs)."""
    key = get_object_or_404(ApiKey, pk=key_id, revoked=False)
    form = PriorityForm(request.POST)
    if not form.is_valid():
        messages.error(request, "the priority must be interactive or background")
        return redirect("api_keys")
    key.priority = form.cleaned_data["priority"]
    key.save(update_fields=["priority"])
    messages.success(request, f"the key {key.name} is {key.priority} now")
    return redirect("api_keys")
