"""What a LAN download may connect to, and what of its URL may be shown.

A download URL comes from a form, and the server it names may redirect anywhere: unguarded,
http://127.0.0.1:6379/ (or a 302 to it) reaches the appliance's own Redis, and
http://169.254.169.254/ a cloud's metadata service. So each hop's host is resolved once here,
every address is checked, and the download connects to an address that passed: nothing
resolves the name again, so a DNS answer that changes between the check and the connect
(rebinding) cannot move the connection.

Refused: loopback, unspecified, link-local (cloud metadata lives there), multicast and
broadcast, and the host:port of the appliance's own Redis and database. Private LAN ranges are
allowed, since LAN downloads are the point, unless DOWNLOAD_ALLOW_PRIVATE is false.

A URL's credentials are used for the request but never shown: `redact_url` and `redact_text`
take out the userinfo and the query's values (where signed URLs keep their tokens).
"""

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IPAddress, int]

_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # "this host on this network": 0.0.0.0 and kin
_BROADCAST = ipaddress.ip_address("255.255.255.255")
# Named so that a refusal says what they are; the link-local rule covers 169.254.0.0/16 anyway,
# and the other two sit in ranges a LAN may use.
_METADATA = frozenset(map(ipaddress.ip_address, [
    "169.254.169.254", "fd00:ec2::254", "100.100.100.200",
]))  # fmt: skip
_PRIVATE = tuple(map(ipaddress.ip_network, [
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
    "100.64.0.0/10",  # carrier-grade NAT, also what Tailscale hands out to a home lab
]))  # fmt: skip
_DATABASE_PORTS = {"postgresql": 5432, "postgis": 5432, "mysql": 3306}
REDACTED = "***"


class AddressRefused(Exception):
    """The download may not connect there; the message says why, in plain words."""


class Service(NamedTuple):
    """One of the appliance's own servers, which no download may reach."""

    name: str
    address: IPAddress
    port: int


@dataclass(frozen=True)
class DownloadPolicy:
    """Where a download may connect; `settings_policy()` is the appliance's."""

    allow_private: bool = True
    services: tuple[Service, ...] = ()
    # Endpoints allowed whatever their address: how tests reach their servers on loopback.
    trusted: frozenset[Endpoint] = frozenset()


def settings_policy() -> DownloadPolicy:
    """The policy of the settings: DOWNLOAD_ALLOW_PRIVATE, and the appliance's own Redis and
    database as services."""
    services = own_services(settings.REDIS_URL, settings.DATABASES["default"])
    return DownloadPolicy(allow_private=settings.DOWNLOAD_ALLOW_PRIVATE, services=services)


def own_services(redis_url: str, database: dict) -> tuple[Service, ...]:
    """The TCP addresses of a Redis URL and a Django database (a Unix socket or SQLite has
    none)."""
    services: list[Service] = []
    if redis_url:
        redis = urlsplit(redis_url)
        if redis.scheme in ("redis", "rediss") and redis.hostname:
            services += _service("Redis", redis.hostname, redis.port or 6379)
    host = str(database.get("HOST") or "")
    port = database.get("PORT") or _DATABASE_PORTS.get(database["ENGINE"].rsplit(".", 1)[-1])
    if host and not host.startswith("/") and port:
        services += _service("database", host, int(port))
    return tuple(services)


def _service(name: str, host: str, port: int) -> list[Service]:
    try:
        return [Service(name, address, port) for address in lookup(host, port)]
    except OSError:  # a name that does not resolve now is not one a download reaches either
        return []


def lookup(host: str, port: int) -> list[IPAddress]:
    """Every address of `host` (a name or an IP literal), in the resolver's order."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(_normal(ipaddress.ip_address(info[4][0])) for info in found))


def _normal(address: IPAddress) -> IPAddress:
    # ::ffff:127.0.0.1 connects to 127.0.0.1: judge it as the IPv4 address it is.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def resolve(host: str, port: int, policy: DownloadPolicy) -> IPAddress:
    """The first address of `host` the policy allows, for the download to connect to; else
    AddressRefused with the reason for the first one. socket.gaierror if it has none."""
    addresses = lookup(host, port)
    for address in addresses:
        if refusal(address, port, policy) is None:
            return address
    first = addresses[0]
    where = str(first) if host.strip("[]") == str(first) else f"{host} ({first})"
    raise AddressRefused(f"the download address {where} {refusal(first, port, policy)}")


def refusal(address: IPAddress, port: int, policy: DownloadPolicy) -> str | None:
    """Why a download may not connect to address:port (the end of a sentence that starts with
    the address), or None when it may."""
    address = _normal(address)
    for service in policy.services:
        if (service.address, service.port) == (address, port):
            return f"is the appliance's own {service.name} (port {port}); downloads never go there"
    if (address, port) in policy.trusted:
        return None
    if address.is_unspecified or address in _THIS_NETWORK:
        return "is unspecified (it means this machine); downloads may only reach other machines"
    if address.is_loopback:
        return "is a loopback address (this machine); downloads may only reach other machines"
    if address in _METADATA:
        return "is a cloud metadata service; downloads never go there"
    if address.is_link_local:
        return "is link-local, where cloud metadata services answer; downloads never go there"
    if address.is_multicast or address == _BROADCAST:
        return "is multicast or broadcast, not one server; downloads never go there"
    if not policy.allow_private and any(address in net for net in _PRIVATE):
        return "is a private LAN address, and DOWNLOAD_ALLOW_PRIVATE is false"
    return None


def redact_url(url: str) -> str:
    """`url` as pages and logs may show it: no userinfo, no query values, no fragment. Text
    that is not an http(s) URL comes back as it is."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return url
    userinfo, at, hostport = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{REDACTED + at if userinfo else ''}{hostport}{parts.path}"
    if parts.query:
        names = (field.partition("=")[0] for field in parts.query.split("&"))
        shown += "?" + "&".join(f"{name}={REDACTED}" for name in names)
    return shown


# Up to white space, less the punctuation of the sentence around it ("..., but", "...: ").
_URL_IN_TEXT = re.compile(r"https?://\S+?(?=[.,;:!?)\]'\"]*(?:\s|$))", re.IGNORECASE)


def redact_text(text: str) -> str:
    """`text` with every http(s) URL in it redacted (an error message, a log line)."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)


class RedactURLs(logging.Filter):
    """Redacts the URLs of a log record: httpx logs every request's URL, token and all."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_text(record.getMessage()), ()
        return True
