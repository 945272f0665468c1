"""Every LAN API route, as Django's resolver has it, is described in /api/openapi.json with each
method its view allows, and named in the README's API section: a route added later fails here
until it is documented in both."""

import re

from dashboard.api.openapi import build
from tests.appliance.routes import api_routes
from tests.live import ROOT

_PARAMETER = re.compile(r"<(?:[^>:]+:)?(?P<name>[^>]+)>")


def described_routes() -> list[tuple[str, tuple[str, ...]]]:
    """(the path as OpenAPI writes it, the methods the view allows) of each declared route."""
    return [("/" + _PARAMETER.sub(r"{\g<name>}", route.pattern), route.policy.methods)
            for route in api_routes() if route.policy is not None]  # fmt: skip


def test_every_route_is_in_the_openapi_description_with_its_methods():
    paths = build()["paths"]
    missing = [
        f"{method} {path}" for path, methods in described_routes()
        for method in methods if method.lower() not in paths.get(path, {})
    ]  # fmt: skip
    assert missing == [], f"describe these in dashboard/api/openapi.py: {missing}"
    routes = {path for path, _ in described_routes()}
    assert set(paths) - routes == set(), "the description names routes that do not exist"


def test_every_route_is_named_in_the_readmes_api_section():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## LAN API\n", 1)[1].split("\n## ", 1)[0]
    # A path up to its first parameter: "/api/blobs/" for /api/blobs/{digest}.
    unnamed = [path for path, _ in described_routes() if path.split("{")[0] not in section]
    assert unnamed == [], f"name these in the README's LAN API section: {unnamed}"
