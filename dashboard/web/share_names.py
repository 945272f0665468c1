"""The names the dashboard shows for shares, the ids the engine reports of whose turn a request
takes (inference.engine.generation.GenerationRequest.share):

    "apikey:<id>"             → the key's name                      ("paperless")
    "apikey:<id>:user:<uid>"  → the key's name and Open WebUI's user ("open-webui · user 7f3a")
    "user:<id>"               → the person's username                ("alice")

anything else, or an id whose key or user is gone, is shown as it is. The engine never sees a
name; this is the one place that turns ids into names. A dashboard asks a few times a second for
the same few shares, so names are kept for NAME_TTL_S (a renamed key shows its new name within
that) and the database is only asked for those not kept.
"""

import re
import threading
import time
from collections.abc import Iterable

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from dashboard.models import ApiKey

NAME_TTL_S = 60.0
MAX_KEPT = 4096  # distinct shares kept; past it the oldest half goes
MAX_REMOTE_USER_CHARS = 64  # Open WebUI's user id comes from a header: shown, but not all of it

# Ids of at most 18 digits: a longer one is no row of ours, and would overflow SQLite's integer.
_SHARE = re.compile(
    r"apikey:(?P<key>\d{1,18})(?::user:(?P<remote>.+))?|user:(?P<user>\d{1,18})", re.DOTALL
)
_kept: dict[str, tuple[float, str]] = {}  # share → (when resolved, name)
_lock = threading.Lock()  # share_names runs on threads of its own


def share_names(shares: Iterable[str], *, now: float | None = None) -> dict[str, str]:
    """{share: the name to show} for every one of `shares`, with at most two queries (keys,
    users) for those not kept from an earlier call."""
    now = time.monotonic() if now is None else now
    wanted = set(shares)
    names = {s: kept[1] for s in wanted if (kept := _kept.get(s)) and now - kept[0] < NAME_TTL_S}
    missing = {share: _SHARE.fullmatch(share) for share in wanted - names.keys()}
    key_ids = {int(m["key"]) for m in missing.values() if m and m["key"]}
    user_ids = {int(m["user"]) for m in missing.values() if m and m["user"]}
    keys = dict(ApiKey.objects.filter(pk__in=key_ids).values_list("pk", "name")) if key_ids else {}
    users = (
        dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))
        if user_ids
        else {}
    )
    for share, match in missing.items():
        name = share
        if match and match["key"] and int(match["key"]) in keys:
            name = keys[int(match["key"])]
            if match["remote"]:
                name += " · user " + match["remote"][:MAX_REMOTE_USER_CHARS]
        elif match and match["user"] and int(match["user"]) in users:
            name = users[int(match["user"])]
        names[share] = name
    with _lock:
        _kept.update({share: (now, names[share]) for share in missing})
        if len(_kept) > MAX_KEPT:
            for share in sorted(_kept, key=lambda s: _kept[s][0])[: len(_kept) // 2]:
                del _kept[share]
    return names


def kept_names(shares: Iterable[str], *, now: float | None = None) -> dict[str, str] | None:
    """The names of `shares` when every one is kept and fresh (no query needed), else None."""
    now = time.monotonic() if now is None else now
    names = {}
    for share in shares:
        kept = _kept.get(share)
        if kept is None or now - kept[0] >= NAME_TTL_S:
            return None
        names[share] = kept[1]
    return names


async def share_names_async(shares: Iterable[str]) -> dict[str, str]:
    """share_names from the event loop: at once when every name is kept, else on a thread of
    its own (the shared sync thread would make the query wait behind chat turns)."""
    shares = set(shares)
    names = kept_names(shares)
    if names is not None:
        return names
    return await database_sync_to_async(share_names, thread_sensitive=False)(shares)
