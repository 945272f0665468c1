"""The Celery app: queue "inference" for generation, queue "jobs" for everything else."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")

app = Celery("appliance")
app.config_from_object("django.conf:settings", namespace="CELERY")
