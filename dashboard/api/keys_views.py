"""The API keys page (/api-keys/): staff create and revoke the keys home apps use.

A new key is shown once, in the response to the form that created it, and never stored: the
database keeps only its hash and a prefix to tell keys apart.
"""

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.models import ApiKey
from dashboard.web.security import staff_required, with_csp


class ApiKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="the home app that will use it, e.g. home-assistant"
    )
    scope = forms.ChoiceField(
        choices=ApiKey.Scope.choices, initial=ApiKey.Scope.CHAT,
        help_text="each scope includes the ones above it; Home Assistant and Open WebUI need "
        "only chat",
    )  # fmt: skip

    household = forms.SlugField(
        max_length=40, required=False,
        help_text="optional: keys with the same household share cached prompts (a long common "
        "system prompt is then read once for all of them); empty keeps this app's cache its own",
    )  # fmt: skip

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if ApiKey.objects.filter(name=name).exists():
            raise forms.ValidationError("a key with this name exists already")
        return name


def _page(request: HttpRequest, form: ApiKeyForm, new_key: str | None = None,
          status: int = 200) -> HttpResponse:  # fmt: skip
    return render(request, "api/keys.html", {
        "form": form,
        "keys": ApiKey.objects.all(),
        "new_key": new_key,
        "base_url": request.build_absolute_uri("/"),
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
                             household=form.cleaned_data["household"])  # fmt: skip
    # Rendered, not redirected: the raw key must not pass through the session or a URL.
    return _page(request, ApiKeyForm(), new_key=raw)


@staff_required
@require_POST
def revoke_key(request: HttpRequest, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=key_id)
    if not key.revoked:
        key.revoked = True
        key.save(update_fields=["revoked"])
        messages.success(request, f"the key {key.name} is revoked")
    return redirect("api_keys")
