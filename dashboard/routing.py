"""WebSocket routes (composed in appliance/asgi.py behind the origin and session checks)."""

from django.urls import path

from dashboard.consumers import ChatConsumer, TelemetryConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/telemetry/", TelemetryConsumer.as_asgi()),
]
