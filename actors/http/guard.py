"""What every request passes before a route: the Host allow-list, the token's scope, the
headers every answer carries, and the cap on connections held at once.

Tokens are compared as HMAC-SHA256 digests under a key drawn at start, each
against every configured token (no early exit): the time a comparison takes
depends on neither a token's bytes nor its length. Who read or did what is
logged (the token's name and scope, the route, the remote address), never
the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import resource
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from actors.http.openapi import OPERATIONS, Scope, scope_of
from actors.observability import HTTP_REFUSED, get_logger
from actors.operator import Forbidden, OperatorError, Unauthorized

log = get_logger("http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Host names answered whatever the settings say: a browser on this machine.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
SAFE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "frame-ancestors 'none'",
}
SERVER_NAME = "claimd"  # no version: what runs here is not told to whoever asks
# Read by actors/http/api/reading.py.
BODY_TIMEOUT_KEY = web.RequestKey("claimd.body_timeout", float)
# The request's (name, scope), once its token is checked.
TOKEN_KEY = web.RequestKey("claimd.token", tuple)


class Tokens:
    """The configured bearer tokens, kept as digests: (name, scope) for a presented one."""

    def __init__(self, tokens: Iterable[Sequence[str]] = ()) -> None:
        self._key = secrets.token_bytes(32)
        known: list[tuple[str, Scope, bytes]] = []
        for entry in tokens:
            name, token = entry[0], entry[1]
            scope = Scope(entry[2]) if len(entry) > 2 else Scope.OPERATE
            known.append((name, scope, self._digest(token.encode())))
        self._known = tuple(known)

    @property
    def configured(self) -> bool:
        return bool(self._known)

    def _digest(self, raw: bytes) -> bytes:
        return hmac.new(self._key, raw, hashlib.sha256).digest()

    def identify(self, header: str) -> tuple[str, Scope]:
        """The (name, scope) of the token in an ``Authorization`` header; Unauthorized if none."""
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("this needs 'Authorization: Bearer <token>'")
        # A header's undecodable bytes arrive as surrogates: compared as the bytes they were.
        presented = self._digest(given.strip().encode("utf-8", "surrogateescape"))
        found: tuple[str, Scope] | None = None
        for name, scope, digest in self._known:  # every token compared: no early exit
            if hmac.compare_digest(presented, digest):
                found = (name, scope)
        if found is None:
            raise Unauthorized("the bearer token is not one this replica accepts")
        return found

    def authorize(self, request: web.Request, scope: Scope) -> tuple[str, Scope] | None:
        """Check ``request``'s token for ``scope``: its (name, scope), None when open.

        Without tokens configured reads are open and actions refused (403, read-only).
        """
        if scope is Scope.OPEN:
            return None
        if not self.configured:
            if scope is Scope.OPERATE:
                raise Forbidden(
                    "this API is read-only: no api_token_file or api_token_env is "
                    "configured in [claimd]"
                )
            return None
        known = request.get(TOKEN_KEY)
        if known is None:
            known = self.identify(request.headers.get("Authorization", ""))
            request[TOKEN_KEY] = known
        if scope is Scope.OPERATE and known[1] is not Scope.OPERATE:
            raise Forbidden(f"the token {known[0]!r} has scope read; this needs scope operate")
        return known


def _host_name(header: str) -> str:
    """A Host header's name, lowercase, without its port ("[::1]" keeps its brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    name, colon, port = header.rpartition(":")
    return (name if colon and port.isdigit() else header).rstrip(".")


def _same_address(name: str, sockname: object) -> bool:
    """Whether ``name`` is the IP address the connection arrived on (Prometheus, probes)."""
    if not isinstance(sockname, tuple) or not sockname:
        return False
    try:
        given = ipaddress.ip_address(name.strip("[]"))
        local = ipaddress.ip_address(str(sockname[0]).partition("%")[0])
    except ValueError:
        return False
    if isinstance(local, ipaddress.IPv6Address) and local.ipv4_mapped is not None:
        local = local.ipv4_mapped
    return given == local


@dataclass(frozen=True)
class Guard:
    """What the HTTP face checks; built from the ``[claimd]`` settings."""

    tokens: Tokens = field(default_factory=Tokens)
    allowed_hosts: frozenset[str] = frozenset()
    metrics_token: bool = False
    # The cap on connections held at once (see connection_cap).
    max_connections: int = 512
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def host_allowed(self, request: web.Request) -> bool:
        """Loopback names, the configured names, or the address the connection arrived on.

        A DNS rebinding page sends its own name, never an IP literal; a request
        without a Host header (HTTP/1.0) comes from no browser.
        """
        header = request.headers.get("Host")
        if header is None or "*" in self.allowed_hosts:
            return True
        name = _host_name(header)
        if name in LOOPBACK_HOSTS or name in self.allowed_hosts:
            return True
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return _same_address(name, sockname)

    def middleware(self) -> Middleware:
        """The Host check, then the route's scope; logged per request with a token."""
        scopes = {
            (op.method.upper(), op.path): scope_of(op, metrics_token=self.metrics_token)
            for op in OPERATIONS
        }

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not self.host_allowed(request):
                HTTP_REFUSED.labels(reason="host").inc()
                log.info(
                    "http: host refused",
                    host=_host_name(request.headers.get("Host", ""))[:100],
                    remote=request.remote,
                )
                return web.json_response(
                    {"error": "this Host is not one claimd answers (setting allowed_hosts)"},
                    status=421,
                )
            info = request.match_info
            route = info.route.resource.canonical if info.route.resource is not None else None
            method = "GET" if request.method == "HEAD" else request.method
            scope = scopes.get((method, route or ""), Scope.OPEN)
            try:
                who = self.tokens.authorize(request, scope)
            except (Unauthorized, Forbidden) as exc:
                HTTP_REFUSED.labels(reason="token" if exc.status == 401 else "scope").inc()
                log.info(
                    "http: refused",
                    status=exc.status,
                    method=request.method,
                    route=route,
                    remote=request.remote,
                    reason=str(exc),
                )
                raise
            request[BODY_TIMEOUT_KEY] = self.body_timeout_s
            status: int | None = None  # None: it raised; json_errors answers (503, 500)
            try:
                response = await handler(request)
                status = response.status
            except (OperatorError, web.HTTPException) as exc:
                status = exc.status
                raise
            finally:
                if who is not None:  # a refusal (404, 409, 422) too: who asked for what
                    log.info(
                        "http: access",
                        token=who[0],
                        scope=who[1].value,
                        method=request.method,
                        route=route,
                        status=status,
                        remote=request.remote,
                    )
            return response

        return guard


async def safe_headers(_: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the headers every answer carries, and no version told."""
    for name, value in SAFE_HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers["Server"] = SERVER_NAME


def connection_cap(setting: int) -> int:
    """Connections held at once: the setting, at most a quarter of the file limit.

    The rest of the limit is the replica's own: its database and NATS
    connections, and the pipes of the jobs it runs.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return setting
    return max(8, min(setting, soft // 4))
