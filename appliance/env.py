"""Typed readers for environment variables that fail loudly, naming the variable."""

import os
from urllib.parse import urlsplit


class ConfigError(Exception):
    """A setting read from the environment has a value the appliance cannot use."""


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envint(name: str, default: int, *, lo: int | None = None, hi: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def envfloat(
    name: str, default: float, *, lo: float | None = None, hi: float | None = None
) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def envsize(name: str, *, hi: int = 1 << 50) -> int | None:
    """A size in bytes: a number with an optional K, M, G or T (binary: 1G is 1024^3; "GiB" and
    "GB" read the same), or "auto" (the default), returned as None."""
    raw = (os.environ.get(name) or "auto").strip().lower()
    if raw == "auto":
        return None
    number = raw.removesuffix("ib").removesuffix("b")
    unit = number[-1:] if number[-1:] in _SIZE_UNITS and number[-1:] else ""
    digits = number[: len(number) - len(unit)].strip()
    try:
        value = int(float(digits) * _SIZE_UNITS[unit])
    except ValueError:
        raise ConfigError(
            f"{name} must be a size such as 512M, 4G or 0, or auto; got {raw!r}"
        ) from None
    if not 0 <= value <= hi:
        raise ConfigError(f"{name} must be between 0 and {hi} bytes, got {value}")
    return value


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def envurl(name: str, default: str) -> str:
    """An http(s) URL with a host, without a trailing slash."""
    raw = (os.environ.get(name) or default).strip().rstrip("/")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name} must be an http:// or https:// URL with a host, got {raw!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{name} must be a plain URL (no credentials, query or fragment)")
    return raw
