"""Create an API key for a home app from the command line; the key is printed once."""

from django.core.management.base import BaseCommand, CommandError

from dashboard.models import ApiKey


class Command(BaseCommand):
    help = (
        "Create an API key NAME with the scope chat (the default), manage (also load, unload "
        "and keep models loaded) or admin (also delete models), and the priority interactive "
        "(the default) or background (an app working through a batch); prints it once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the home app that will use the key")
        parser.add_argument(
            "--scope", choices=ApiKey.Scope.values, default=ApiKey.Scope.CHAT,
            help="; ".join(label for _, label in ApiKey.Scope.choices),
        )  # fmt: skip
        parser.add_argument(
            "--priority", choices=ApiKey.Priority.values, default=ApiKey.Priority.INTERACTIVE,
            help="; ".join(label for _, label in ApiKey.Priority.choices),
        )  # fmt: skip

    def handle(self, *args, name: str, scope: str, priority: str, **options) -> None:
        name = name.strip()
        if not name or len(name) > ApiKey._meta.get_field("name").max_length:
            raise CommandError("the name must be 1 to 100 characters")
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"a key named {name!r} exists already (revoke it in /api-keys/)")
        _, raw = ApiKey.create(name, scope, priority=priority)
        self.stderr.write(f"created {scope} key {name!r} ({priority}); it is shown only this once:")
        self.stdout.write(raw)
