"""Access and browser-side hardening for the pages."""

from collections.abc import Callable
from functools import wraps
from inspect import iscoroutinefunction

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse


def staff_required(view: Callable) -> Callable:
    """Logged-in staff only, for sync and async views alike: anonymous users go to the login
    page, others get a 403."""
    if iscoroutinefunction(view):

        @wraps(view)
        async def wrapper_async(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not (await request.auser()).is_staff:
                raise PermissionDenied("staff only")
            return await view(request, *args, **kwargs)

        return login_required(wrapper_async)

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        return view(request, *args, **kwargs)

    return login_required(wrapper)


def content_security_policy(request: HttpRequest) -> str:
    """Scripts only from our own files: should model output ever slip past DOMPurify, the
    browser still refuses to run it. WebSockets only back to this host."""
    host = request.get_host()
    return "; ".join([
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",  # uPlot positions its parts with style attributes
        "img-src 'self' data:",
        f"connect-src 'self' ws://{host} wss://{host}",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ])  # fmt: skip


def with_csp(view: Callable) -> Callable:
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.setdefault("Content-Security-Policy", content_security_policy(request))
        return response

    return wrapper
