"""Forgetting what the box keeps for an app key or a person once they are gone.

Warm memory (inference.engine.tiers) keeps prompts per partition: an app key's
(ApiKey.cache_partition: "apikey:<pk>", or "household:<name>" for the keys of a household) and
a person's on the chat page (person_partition: "user:<id>"). A revoked or deleted key is never
asked for again and a deleted person's conversations are gone, so what is kept for them only
holds their text and takes room: it is forgotten (InferenceClient.forget_prompts: the loaded
runners' RAM and disk tiers, and the files of models not loaded, on every box). A household's
partition goes with its last live key: the others still use it.

Signals (connected in dashboard.apps) catch every way a key or a user goes: the pages, the
admin, the shell. The forgetting waits for the transaction to commit (a delete rolled back
forgets nothing) and runs on a thread of its own, since the client may wait for every worker
over Redis and nobody should wait for it; a failure is logged and never breaks the delete.
"""

import logging
import threading

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from dashboard.models import ApiKey, person_partition
from inference.serving.client import get_client

log = logging.getLogger(__name__)

_running: set[threading.Thread] = set()
_running_lock = threading.Lock()


def forget_after_commit(partition: str) -> None:
    """Forget `partition`'s kept prompts once the current transaction commits (at once when
    there is none), on a thread of its own."""
    transaction.on_commit(lambda: _start(partition))


def _start(partition: str) -> None:
    thread = threading.Thread(target=_forget, args=(partition,), daemon=True,
                              name=f"forget {partition}")  # fmt: skip
    with _running_lock:
        _running.add(thread)
    thread.start()


def _forget(partition: str) -> None:
    try:
        forgotten = async_to_sync(get_client().forget_prompts)(partition=partition)
    except Exception:  # noqa: BLE001 - a worker away: its entries stay until their bound
        log.warning("the kept prompts of %s could not be forgotten", partition, exc_info=True)
    else:
        log.info("forgot %d kept prompts of %s", forgotten, partition)
    finally:
        with _running_lock:
            _running.discard(threading.current_thread())


def wait(timeout: float = 30.0) -> bool:
    """Until the forgetting started so far has ended (tests, a clean stop); False if some is
    still running after `timeout` seconds."""
    with _running_lock:
        threads = list(_running)
    for thread in threads:
        thread.join(timeout)
    return not any(thread.is_alive() for thread in threads)


def forget_key(key: ApiKey) -> None:
    """A key gone (revoked or deleted): its partition, unless another live key shares it."""
    shared = key.household and (
        ApiKey.objects.filter(household=key.household, revoked=False).exclude(pk=key.pk).exists()
    )  # fmt: skip
    if not shared:
        forget_after_commit(key.cache_partition)


def _key_saved(sender, instance: ApiKey, update_fields=None, **kwargs) -> None:
    if instance.revoked and (update_fields is None or "revoked" in update_fields):
        forget_key(instance)


def _key_deleted(sender, instance: ApiKey, **kwargs) -> None:
    forget_key(instance)


def _user_deleted(sender, instance, **kwargs) -> None:
    forget_after_commit(person_partition(instance.pk))


def connect() -> None:
    """The signals that forget (DashboardConfig.ready)."""
    post_save.connect(_key_saved, sender=ApiKey, dispatch_uid="forget-revoked-key")
    post_delete.connect(_key_deleted, sender=ApiKey, dispatch_uid="forget-deleted-key")
    post_delete.connect(_user_deleted, sender=get_user_model(), dispatch_uid="forget-deleted-user")
