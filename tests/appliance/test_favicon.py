"""The favicon: linked from every page and answered at /favicon.ico, which browsers ask for
whatever a page links, so no page logs a 404."""

import pytest

pytestmark = pytest.mark.django_db


def test_favicon_ico_points_at_the_svg_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"


def test_every_page_links_the_icon(client):
    page = client.get("/login/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
