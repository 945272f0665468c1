"""The API keys page (/api-keys/): a page for staff, not part of the LAN API."""

from django.urls import path

from dashboard.keys import views

urlpatterns = [
    path("api-keys/", views.keys_page, name="api_keys"),
    path("api-keys/<int:key_id>/revoke/", views.revoke_key, name="revoke_api_key"),
    path("api-keys/<int:key_id>/priority/", views.set_key_priority, name="api_key_priority"),
]
