from django.contrib import admin
from django.urls import include, path

from dashboard.web.throttle import ThrottledAdminAuthenticationForm

# The admin's own login page counts against the same sign-in limits as /login/.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("dashboard.urls")),
]
