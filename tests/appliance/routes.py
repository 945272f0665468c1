"""The LAN API's routes as Django's URL resolver has them, so that a route added later is in every
test that walks them without anyone editing a list.

A route written with path() is named by a concrete path (each converter filled with a sample);
one written with re_path() has no path to name it, so it is returned with `path` None (today
only the catch-alls of unknown paths, which declare nothing).
"""

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RoutePattern

from dashboard.api.auth import EndpointPolicy, policy_of
from dashboard.api.urls import ROOT_PATHS

API_PREFIXES = ("v1/", "api/")
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
SAMPLES = {"int": "1", "str": "x", "slug": "x", "path": "some/model",
           "uuid": "00000000-0000-0000-0000-000000000000"}  # fmt: skip
_CONVERTER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


@dataclass(frozen=True)
class Route:
    pattern: str  # as written, "v1/models/<path:model_id>"
    path: str | None  # a concrete path that resolves to it, "/v1/models/some/model"
    view: Callable

    @property
    def policy(self) -> EndpointPolicy | None:
        return policy_of(self.view)


@dataclass(frozen=True)
class KeyedBody:
    """A method that sends a body to a route whose view declares that it needs a key."""

    method: str
    path: str
    policy: EndpointPolicy

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _sample(route: str) -> str:
    return _CONVERTER.sub(lambda m: SAMPLES[m["converter"] or "str"], route)


def _walk(patterns, prefix: str = "", concrete: bool = True) -> Iterator[Route]:
    for entry in patterns:
        written = str(entry.pattern)
        here = concrete and isinstance(entry.pattern, RoutePattern)
        pattern = prefix + written.removeprefix("^").removesuffix("$")
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + _sample(written), here)
        elif isinstance(entry, URLPattern):
            path = "/" + prefix + _sample(written) if here else None
            yield Route(pattern, path, entry.callback)


def api_routes() -> list[Route]:
    """Every route under /v1/, /api/, and at the root paths of the API (/metrics, /tokenize...)."""
    routes = [
        route for route in _walk(get_resolver().url_patterns)
        if route.pattern.startswith(API_PREFIXES) or f"/{route.pattern}" in ROOT_PATHS
    ]  # fmt: skip
    for route in routes:
        if route.path is not None:
            assert resolve(route.path).func is route.view, f"{route.path} names another route"
    return routes


def keyed_body_routes() -> list[KeyedBody]:
    """Each method with a body that a route's declaration allows and guards with a key."""
    return [
        KeyedBody(method, route.path, route.policy)
        for route in api_routes()
        if route.path is not None and route.policy is not None and route.policy.needs_key()
        for method in route.policy.methods
        if method in BODY_METHODS
    ]
