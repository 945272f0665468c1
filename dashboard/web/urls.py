"""Pages: login/logout, chat, the staff dashboard, and /healthz."""

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.web import health, images, views
from dashboard.web.security import with_csp
from dashboard.web.throttle import ThrottledLoginView

urlpatterns = [
    path(  # Django's LoginView, with the failed sign-in limits (dashboard.web.throttle)
        "login/",
        with_csp(ThrottledLoginView.as_view(redirect_authenticated_user=True)),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.chat_page, name="chat"),
    path("c/<int:conversation_id>/", views.chat_page, name="conversation"),
    path("c/<int:conversation_id>/delete/", views.delete_conversation, name="delete_conversation"),
    path("chat/images/", images.upload, name="chat_image_upload"),
    path("chat/images/<int:image_id>/", images.image, name="chat_image"),
    path("dashboard/", views.dashboard_page, name="dashboard"),
    path("dashboard/requests/", views.recent_requests_json, name="recent_requests"),
    path("healthz", health.healthz, name="healthz"),
]
