"""First-run setup: the admin account, the models already on disk or in packages, and the
removal of uploaded blobs no model was made of (inference.jobs.tasks.keep_blobs_pruned).

No default password is ever used on the LAN: ADMIN_PASSWORD sets it, otherwise a random one is
generated and printed once, on the run that creates the account.
"""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account on first run and register packaged and on-disk models."

    def handle(self, *args, **options) -> None:
        self.ensure_admin()
        from inference.catalog.importing import register_packaged_models, scan_models_dir
        from inference.jobs.tasks import schedule_hash

        for model in register_packaged_models():
            self.stdout.write(f"starter model: {model.name} ({model.file_path})")
        for model in scan_models_dir(schedule_hash):
            self.stdout.write(f"found model: {model.name} ({model.file_path})")
        from inference.jobs.tasks import keep_blobs_pruned

        keep_blobs_pruned()  # uploads no model was made of, left from before

    def ensure_admin(self) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        password = settings.ADMIN_PASSWORD or secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", password=password)
        if settings.ADMIN_PASSWORD:
            self.stdout.write("created user 'admin' with the password from ADMIN_PASSWORD")
        else:
            self.stdout.write(self.style.WARNING(
                f"created user 'admin' with password: {password}\n"
                "  (shown once; change it at /admin/password_change/)"
            ))  # fmt: skip
