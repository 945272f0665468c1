"""The models page's "pull by name": the same pull job as /api/pull (inference.catalog.pulling), its
progress in the page's jobs table like a download's. Staff only."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from dashboard.model_pages.forms import PullForm
from dashboard.model_pages.views import job_json, wants_json
from dashboard.web.security import staff_required
from inference.jobs import tasks


@staff_required
@require_POST
def pull(request: HttpRequest) -> HttpResponse:
    form = PullForm(request.POST)
    if not form.is_valid():
        message = form.errors["name"][0]
        if wants_json(request):
            return JsonResponse({"error": message}, status=400)
        messages.error(request, f"Pull refused: {message}")
        return redirect("models")
    job = tasks.schedule_pull(form.cleaned_data["name"])
    if wants_json(request):
        return JsonResponse(job_json(job), status=202)
    messages.info(request, f"Pulling {job.source}: progress below.")
    return redirect("models")
