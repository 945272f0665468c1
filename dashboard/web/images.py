"""The chat page's pictures over HTTP, its owner's only (dashboard.chat.images keeps them):

- POST /chat/images/ with a picture as the body (Content-Type image/*): stored as an attachment
  waiting to be sent; answers {"image": {"id", "url", "width", "height"}}. The socket's send
  frame then names it by id. appliance.gate refuses a body over MAX_IMAGE_BYTES, and one from
  a browser without a session, before reading it.
- GET /chat/images/<id>/: the picture, for its thumbnail and for opening it whole.
- DELETE /chat/images/<id>/: an attachment removed before it was sent.

Someone else's image is a 404, the same as one that does not exist. Errors are JSON
({"error": {"message", "code"}}, as the gate's 413) for the page's script to show.
"""

from collections.abc import Callable
from functools import wraps

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from dashboard.chat import ChatRefused, images
from dashboard.models import ChatImage

STATUS = {"too_large": 413, "too_many": 409}  # other refusals: 400


def _error(status: int, message: str, code: str) -> JsonResponse:
    return JsonResponse({"error": {"message": message, "code": code}}, status=status)


def _signed_in(view: Callable) -> Callable:
    """A JSON 401 for a script whose session ended (not the sign-in page's redirect)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return _error(401, "you have been logged out; log in again", "unauthorized")
        return view(request, *args, **kwargs)

    return wrapper


@never_cache
@_signed_in
@require_http_methods(["POST"])
def upload(request: HttpRequest) -> HttpResponse:
    # read() and not .body: .body is capped at DATA_UPLOAD_MAX_MEMORY_SIZE, a JSON body's cap;
    # the gate has bounded this body already, and one byte more says it was longer still.
    data = request.read(images.MAX_IMAGE_BYTES + 1)
    try:
        image = images.store(request.user, data)
    except ChatRefused as exc:
        return _error(STATUS.get(exc.code, 400), exc.message, exc.code)
    return JsonResponse({"image": images.as_page(image)}, status=201)


@_signed_in
@require_http_methods(["GET", "HEAD", "DELETE"])
def image(request: HttpRequest, image_id: int) -> HttpResponse:
    found = ChatImage.objects.filter(pk=image_id, user=request.user).first()
    if found is None:
        return _error(404, "no such image", "not_found")
    if request.method == "DELETE":
        if found.message_id is not None:  # a sent one goes with its message
            return _error(409, "this image belongs to a message", "sent")
        found.delete()
        return HttpResponse(status=204)
    try:
        opened = open(images.path_of(found), "rb")  # noqa: SIM115 - FileResponse closes it
    except OSError:
        return _error(404, "this image's file is missing", "not_found")
    response = FileResponse(opened, content_type=f"image/{found.kind}")
    # The same id is always the same bytes: the browser may keep it, but only for this person.
    response["Cache-Control"] = "private, max-age=86400"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["X-Content-Type-Options"] = "nosniff"
    return response
