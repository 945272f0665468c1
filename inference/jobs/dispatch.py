"""Run a background job: a Celery task on queue "jobs" in split mode, a thread when embedded.

Either way it starts after the current transaction commits, so the job sees the rows that
asked for it.
"""

import logging
import threading

from django.conf import settings
from django.db import close_old_connections, transaction

log = logging.getLogger(__name__)


def dispatch(task, *args) -> None:
    if settings.SPLIT_MODE:
        transaction.on_commit(lambda: task.delay(*args))
        return

    def run() -> None:
        try:
            task(*args)
        except Exception:  # noqa: BLE001 - the task records its own failure; log the rest
            log.exception("job %s failed", getattr(task, "name", task))
        finally:
            close_old_connections()

    transaction.on_commit(lambda: threading.Thread(target=run, daemon=True).start())
