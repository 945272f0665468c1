"""The models page's "derive a model": the same derived model as /api/create `from` makes
(inference.catalog.creating): the base's weights, its own system prompt and sampling. Staff only."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from dashboard.model_pages.display import flash_text
from dashboard.model_pages.forms import DeriveForm
from dashboard.web.security import staff_required
from inference.catalog import creating


@staff_required
@require_POST
def derive(request: HttpRequest) -> HttpResponse:
    form = DeriveForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{field}: {error}" for field, errs in form.errors.items()
                           for error in errs)  # fmt: skip
        messages.error(request, flash_text(f"Derived model refused: {errors}"))
        return redirect("models")
    try:
        parameters, _ = creating.sampling_parameters(form.parameters())
        model = creating.derive(form.cleaned_data["base"], form.cleaned_data["name"],
                                system=form.cleaned_data["system"] or None,
                                parameters=parameters)  # fmt: skip
    except creating.CreateRefused as exc:
        messages.error(request, flash_text(f"Derived model refused: {exc}"))
        return redirect("models")
    messages.success(request, f"Made {model.name} from {model.base.name}: it shares its "
                     "weights and loads no second copy.")  # fmt: skip
    return redirect("models")
