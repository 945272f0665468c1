"""Sign-in throttling: failed sign-ins are counted per account and per client address.

After LOGIN_FAILURES_PER_ACCOUNT failures for one user name, or LOGIN_FAILURES_PER_ADDRESS from
one client address, within LOGIN_LOCKOUT_MINUTES of the first of them, sign-ins for that account
(from anywhere) or from that address (for any account) are refused, the right password included,
until those minutes have passed; the login page says how long is left. A successful sign-in
clears its account's count. Unknown user names are counted like real ones, so the answers do not
tell which accounts exist. Both /login/ and the Django admin's login go through here.

Each attempt takes its place in the counts (an atomic increment) before its password is checked,
so guesses sent in parallel cannot all pass the check before the first one is counted.

The counts live in Django's cache (appliance/settings.py: the local-memory cache of the one web
process in embedded mode, Redis shared by every web process in split mode). Should the cache
fail, sign-ins are let through and the error is logged: passwords still guard the box, and a
broken cache must not lock the household out.
"""

import hashlib
import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

clock = time.time  # wall-clock seconds, comparable across web processes; tests move it
_PREFIX = "login-throttle:"


class Throttled(Exception):
    """Sign-ins are refused for now: `message` says for how long."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def _window() -> float:
    return settings.LOGIN_LOCKOUT_MINUTES * 60.0


def _minutes(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60.0))
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


@dataclass(frozen=True, slots=True)
class _Bucket:
    """The failures of one account or of one client address."""

    kind: str  # "account" or "address"
    who: str  # for the log
    limit: int

    @property
    def key(self) -> str:
        # Hashed: a user name is whatever the visitor typed, and cache keys have rules.
        digest = hashlib.sha256(f"{self.kind}\0{self.who}".encode()).hexdigest()[:40]
        return f"{_PREFIX}{self.kind}:{digest}"

    @property
    def since_key(self) -> str:
        return f"{self.key}:since"

    def refusal(self, left: float) -> Throttled:
        where = "for this account" if self.kind == "account" else "from this address"
        return Throttled(f"Too many failed sign-ins {where}; try again in {_minutes(left)}.", left)

    def count(self) -> tuple[int, float]:
        """(attempts counted in the current window, seconds until it ends)."""
        values = cache.get_many([self.key, self.since_key])
        since = values.get(self.since_key)
        left = 0.0 if since is None else since + _window() - clock()
        if left <= 0:
            return 0, 0.0
        return int(values.get(self.key, 0)), left

    def reserve(self) -> tuple[int, float]:
        """Count one attempt; returns the count with it and the seconds left in the window."""
        now, window = clock(), _window()
        timeout = math.ceil(window) + 60  # the cache forgets a little after the window ends
        since = cache.get(self.since_key)
        if since is not None and now >= since + window:
            cache.delete_many([self.key, self.since_key])  # that window is over: a new one
            since = None
        if since is None:
            # add(), not set(): a parallel first attempt must not reset what another counted.
            cache.add(self.since_key, now, timeout)
            cache.add(self.key, 0, timeout)
            since = cache.get(self.since_key, now)
        try:
            count = cache.incr(self.key)
        except ValueError:  # it expired between add() and incr()
            cache.add(self.key, 0, timeout)
            count = cache.incr(self.key)
        return count, max(since + window - now, 0.0)

    def clear(self) -> None:
        cache.delete_many([self.key, self.since_key])

    def give_back(self) -> None:
        try:
            cache.decr(self.key)
        except ValueError:
            pass  # already forgotten


def _buckets(username: str, address: str) -> tuple[_Bucket, _Bucket]:
    return (
        _Bucket("account", username.strip().casefold(), settings.LOGIN_FAILURES_PER_ACCOUNT),
        _Bucket("address", address, settings.LOGIN_FAILURES_PER_ADDRESS),
    )


class Attempt:
    """One sign-in attempt, counted already; report how it went."""

    def __init__(self, account: _Bucket | None = None, address: _Bucket | None = None,
                 counts: tuple[int, int] = (0, 0)):  # fmt: skip
        self.account = account
        self.address = address
        self.counts = counts

    def failed(self) -> None:
        """The attempt stays counted; say so in the log when it locks something."""
        for bucket, count in zip((self.account, self.address), self.counts, strict=True):
            if bucket is not None and count == bucket.limit:
                log.warning(
                    "sign-ins %s %r refused for %d minutes after %d failures",
                    "for the account" if bucket.kind == "account" else "from the address",
                    bucket.who[:150], settings.LOGIN_LOCKOUT_MINUTES, count,
                )  # fmt: skip

    def succeeded(self) -> None:
        """The account's count starts again; the address gives back this attempt's place."""
        if self.account is None:
            return
        try:
            self.account.clear()
            self.address.give_back()
        except Exception:  # noqa: BLE001 - the sign-in has succeeded; counts are best effort
            log.exception("the sign-in throttle could not update its counts")


def begin(username: str, address: str) -> Attempt:
    """Before the password is checked: raise Throttled if the account or the address is over
    its limit, else count the attempt and return it, to be reported failed() or succeeded()."""
    buckets = _buckets(username, address)
    try:
        for bucket in buckets:
            count, left = bucket.count()
            if count >= bucket.limit:
                raise bucket.refusal(left)
        counts = []
        for bucket in buckets:
            count, left = bucket.reserve()
            if count > bucket.limit:  # parallel attempts took the last places
                raise bucket.refusal(left)
            counts.append(count)
    except Throttled:
        raise
    except Exception:  # noqa: BLE001 - see the module's docstring: fail open, loudly
        log.exception("the sign-in throttle's cache failed; this sign-in is not throttled")
        return Attempt()
    return Attempt(*buckets, counts=tuple(counts))


def client_address(request: HttpRequest | None) -> str:
    """The peer's address as the server saw it (behind a reverse proxy: the proxy's)."""
    if request is None:
        return "unknown"
    return request.META.get("REMOTE_ADDR") or "unknown"


class ThrottledLoginMixin:
    """For an AuthenticationForm: the throttle around its password check."""

    throttled: Throttled | None = None

    def clean(self):
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if username is None or not password:
            return super().clean()  # a missing field: nothing is checked, nothing counted
        try:
            attempt = begin(username, client_address(self.request))
        except Throttled as exc:
            self.throttled = exc
            raise ValidationError(exc.message, code="throttled") from None
        try:
            cleaned = super().clean()
        except ValidationError:
            attempt.failed()
            raise
        attempt.succeeded()
        return cleaned


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    """Django's LoginView with the throttle; a refused sign-in is a 429 with Retry-After."""

    form_class = ThrottledAuthenticationForm

    def form_invalid(self, form) -> HttpResponse:
        response = super().form_invalid(form)
        if getattr(form, "throttled", None) is not None:
            response.status_code = 429
            response["Retry-After"] = str(max(1, math.ceil(form.throttled.retry_after)))
        return response
