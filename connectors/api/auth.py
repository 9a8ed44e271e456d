"""Bearer-token authentication: read routes take a read or write token, writes a write token.

With no token configured at all the service is open (and ``serve`` keeps it on
loopback). The UI may carry the token in a cookie set by its login form, since a
browser cannot add an Authorization header to a page load.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .errors import ApiError
from .settings import ServiceSettings

UI_COOKIE = "firstfault_token"
_bearer = HTTPBearer(auto_error=False, description="a token from FIRSTFAULT_READ_TOKENS or FIRSTFAULT_WRITE_TOKENS")


def _known(token: str, tokens: Iterable[str]) -> bool:
    # Compare against every token, in constant time per comparison.
    hits = [hmac.compare_digest(token.encode(), t.encode()) for t in tokens]
    return any(hits)


class Auth:
    """Dependencies for the two access levels, bound to one settings object."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.enabled = settings.auth_enabled
        self._read = settings.read_tokens | settings.write_tokens
        self._write = settings.write_tokens

    def token_level(self, token: str | None) -> str | None:
        """``"write"``, ``"read"`` or None for a token."""
        if not token:
            return None
        if _known(token, self._write):
            return "write"
        return "read" if _known(token, self._read) else None

    def _check(self, token: str | None, need: str) -> None:
        if not self.enabled:
            return
        if not token:
            raise ApiError(401, "unauthenticated", "a bearer token is required",
                           headers={"WWW-Authenticate": 'Bearer realm="firstfault"'})
        level = self.token_level(token)
        if level is None:
            raise ApiError(401, "invalid_token", "the bearer token is not valid",
                           headers={"WWW-Authenticate": 'Bearer realm="firstfault", error="invalid_token"'})
        if need == "write" and level != "write":
            raise ApiError(403, "insufficient_scope", "this route needs a write token (FIRSTFAULT_WRITE_TOKENS)",
                           headers={"WWW-Authenticate": 'Bearer realm="firstfault", error="insufficient_scope"'})

    def dependency(self, need: str, allow_cookie: bool = False) -> Callable[..., None]:
        """A FastAPI dependency; with auth enabled it also declares the bearer scheme in OpenAPI."""
        if not self.enabled:
            def open_route() -> None:
                return None
            return open_route

        def check(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
            token = creds.credentials if creds else None
            if token is None and allow_cookie:
                token = request.cookies.get(UI_COOKIE)
            self._check(token, need)
        return check
