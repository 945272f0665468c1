from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from dashboard.web.throttle import ThrottledAdminAuthenticationForm

# The admin's own login page counts against the same sign-in limits as /login/.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico whatever the page links: answer it, never a 404 in the log.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("", include("dashboard.urls")),
]

# An unknown path's 404 is JSON for API clients and llama-server's paths, HTML for browsers.
handler404 = "dashboard.api.errors.not_found"
