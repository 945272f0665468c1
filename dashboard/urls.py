"""Four URL sets, one per part of the product: pages, the API keys page, the LAN API, the model
pages."""

from django.urls import include, path

urlpatterns = [
    path("", include("dashboard.web.urls")),
    path("", include("dashboard.keys.urls")),
    path("", include("dashboard.api.urls")),
    path("models/", include("dashboard.model_pages.urls")),
]
