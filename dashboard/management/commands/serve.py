"""Serve the appliance with Daphne: HTTP and WebSockets in one process.

Embedded mode (no REDIS_URL): this process also hosts the engine and runs jobs on threads.
Split mode: it only serves; inference and jobs workers are separate Celery processes.
"""

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Migrate, bootstrap, and serve on HOST:PORT with Daphne."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST)
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--skip-setup", action="store_true", help="no migrate/bootstrap")

    def handle(self, *args, host: str, port: int, skip_setup: bool, **options) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        if not skip_setup:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("bootstrap")
        mode = "split (Redis)" if settings.SPLIT_MODE else "embedded"
        self.stdout.write(f"serving on http://{host}:{port}/ in {mode} mode")

        from appliance.asgi import application

        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            http_timeout=None,  # streamed answers can be long
            websocket_handshake_timeout=10,
            application_close_timeout=10,
            server_name="homelab-appliance",
        ).run()
