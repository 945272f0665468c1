"""Serve the appliance with uvicorn: HTTP and WebSockets in one process.

Uvicorn, not Daphne: Daphne (through Twisted) reads a whole request body before it calls the
app, so an anonymous 50 MB POST was received to the last byte before the gate (appliance.gate)
could answer 401; uvicorn calls the app once the headers are in and streams the body to it.

Embedded mode (no REDIS_URL): this process also hosts the engine and runs jobs on threads.
Split mode: it only serves; inference and jobs workers are separate Celery processes.
"""

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Migrate, bootstrap, and serve on HOST:PORT with uvicorn."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST)
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument("--skip-setup", action="store_true", help="no migrate/bootstrap")

    def handle(self, *args, host: str, port: int, skip_setup: bool, **options) -> None:
        import uvicorn

        if not skip_setup:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("bootstrap")
        mode = "split (Redis)" if settings.SPLIT_MODE else "embedded"
        self.stdout.write(f"serving on http://{host}:{port}/ in {mode} mode")
        if not settings.SPLIT_MODE:  # split mode: each inference worker reloads its own
            from inference.serving.client import get_client

            get_client().reload_previous()  # the models loaded at the last stop, in the background

        from appliance.asgi import application

        uvicorn.run(
            application,
            host=host,
            port=port,
            ws="websockets",
            lifespan="off",  # Django's ASGI handler has no lifespan events
            timeout_graceful_shutdown=10,  # answers in progress, then the runners stop
            server_header=False,
            log_level="warning",
        )
