"""The Django project: settings, ASGI composition, URLs and the Celery app."""
