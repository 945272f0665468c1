"""The Django project: settings, ASGI composition, URLs and the Celery app."""

# Loaded with Django so that every task binds to this app (and its Redis broker) when queued.
from appliance.celery import app as celery_app

__all__ = ["celery_app"]
