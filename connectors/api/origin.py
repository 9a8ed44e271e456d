"""Requests from other web sites: refused when they would change something, and the Host header checked.

**Cross-site writes.** A page on another site can make a visitor's browser post a form to
the service (on loopback, with no token; or with the pages' login cookie). Every
state-changing request (POST, PUT, PATCH, DELETE) a browser marks as coming from another
origin is refused with 403 ``cross_site_request``: ``Sec-Fetch-Site`` (every current browser
sends it) must be ``same-origin`` or ``none`` (typed by the user); a browser that sends no
``Sec-Fetch-Site`` is judged by ``Origin``, which must be the service's own (its ``Host``).
A request with neither header is not a browser's cross-site request (curl, programs, the
stream's tools) and goes on to the usual token check.

**Host header.** A service bound to loopback answers only requests that name a loopback host
(``localhost``, ``*.localhost``, ``127.0.0.1``, ``[::1]``): a page whose DNS name was
re-bound to 127.0.0.1 cannot read or write through the visitor's browser. Elsewhere any host
is answered, unless ``FIRSTFAULT_ALLOWED_HOSTS`` lists the names (``*.example.com`` matches
sub-domains; ``*`` any), which then hold wherever the service listens (behind a proxy that
passes its own ``Host``, list that name).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request

from .errors import ApiError, error_response
from .settings import ServiceSettings, env_name

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TRUSTED_FETCH_SITES = frozenset({"same-origin", "none"})


def _split_host(value: str) -> tuple[str, int | None]:
    """``"Example.com:8080"`` -> ``("example.com", 8080)``; ``"[::1]:80"`` -> ``("::1", 80)``."""
    value = value.strip().lower()
    port: int | None = None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return host, port
    if value.count(":") == 1:
        host, _, p = value.partition(":")
        if p.isdigit():
            port = int(p)
        return host, port
    return value, None


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_origin(origin: str, host_header: str | None) -> bool:
    """Does the ``Origin`` name the host (and port, when the Host header states one) this request reached?"""
    if not host_header or origin == "null":
        return False
    try:
        parts = urlsplit(origin)
        o_host, o_port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not o_host:
        return False
    h_host, h_port = _split_host(host_header)
    if o_host != h_host:
        return False
    if h_port is None:                # a bare name (a TLS proxy may pass it): the origin's default port
        return o_port is None
    default = {"http": 80, "https": 443}
    return (o_port or default[parts.scheme]) == h_port


def check_same_origin(request: Request) -> None:
    """403 for a state-changing request a browser says another site sent (an app-wide dependency)."""
    if request.method not in UNSAFE_METHODS:
        return
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if site is not None:
        if site.strip().lower() in TRUSTED_FETCH_SITES:
            return
        why = f"Sec-Fetch-Site: {site.strip()[:40]}"
    elif origin is not None:
        if _same_origin(origin.strip(), request.headers.get("host")):
            return
        why = f"Origin: {origin.strip()[:100]}"
    else:
        return                        # not a browser's cross-site request: curl, programs
    raise ApiError(403, "cross_site_request",
                   f"refused a {request.method} sent by a page of another web site ({why}); the service takes "
                   "changes from its own pages and from programs, not from other sites")


def _host_allowed(host: str, allowed: Iterable[str]) -> bool:
    for pattern in allowed:
        if pattern == "*" or host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class HostCheckMiddleware:
    """400 ``invalid_host`` for a request whose Host header this service does not answer to (see the module)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], settings: ServiceSettings) -> None:
        self.app = app
        self.allowed = frozenset(h.strip().lower() for h in settings.allowed_hosts if h.strip())
        self.loopback_bound = _bound_to_loopback(settings.host)

    def _refuse(self, scope: Scope) -> str | None:
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"host")
        if raw is None:
            return None                   # HTTP/1.0 without a Host: no browser sends that
        host, _ = _split_host(raw.decode("latin-1"))
        if self.allowed:
            if _host_allowed(host, self.allowed):
                return None
            return f"Host {host[:100]!r} is not one this service answers to ({env_name('allowed_hosts')})"
        server = scope.get("server")
        # Bound to loopback and reached on it (an in-process test client reaches no socket at all).
        on_loopback = bool(server) and isinstance(server[0], str) and _is_loopback_ip(server[0])
        if self.loopback_bound and on_loopback and not is_loopback_name(host):
            return (f"Host {host[:100]!r} is not a loopback name, and the service listens on loopback only; "
                    f"set {env_name('allowed_hosts')} to the names it may be reached by")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            why = self._refuse(scope)
            if why is not None:
                response = error_response(400, "invalid_host", why)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bound_to_loopback(host: str) -> bool:
    return host == "localhost" or _is_loopback_ip(host)
