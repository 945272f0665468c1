"""The one composition point: HTTP through the body gate into Django, WebSockets through
Channels with origin and session checks."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()  # before importing consumers: it sets Django up

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from appliance.gate import BodyGate  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Refuses hostile bodies from the headers alone and stamps arrival (appliance.gate).
        "http": BodyGate(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
