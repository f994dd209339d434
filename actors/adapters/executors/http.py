"""The http executor: one request with the run in its headers (Idempotency-Key).

What it receives is bounded: the body is streamed and only its tail kept (the
output tail's size), at most ``HTTP_BODY_LIMIT`` bytes are read, and the run's
timeout covers everything from connecting to the body's last byte. Redirects
are followed within the URL's origin only (scheme, host, port): a redirect to
another origin is the run's answer, not followed, so ``secret_headers`` go to
the host the job names and nowhere else.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import aiohttp
from yarl import URL

from actors.adapters.executors.common import (
    MissingSecret,
    Tail,
    elapsed,
    fill,
    resolve_secrets,
    scrub,
)
from actors.domain import (
    ExecutionResult,
    HttpSpec,
    Outcome,
    RunContext,
)

# Bytes of a response body read at most: past them the run fails and the
# connection is closed (what is kept is the tail alone, whatever the size).
HTTP_BODY_LIMIT = 16 * 1024 * 1024
MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


async def run_http(spec: HttpSpec, context: RunContext, timeout: timedelta) -> ExecutionResult:
    """Send the request with the run's identity as headers (``Idempotency-Key``)."""
    try:
        secrets = resolve_secrets(spec.secret_headers)
    except MissingSecret as exc:
        return ExecutionResult(Outcome.FAILED, error=str(exc))
    return scrub(await _run_http(spec, context, timeout, secrets), secrets.values())


def _origin(url: URL) -> tuple[str, str | None, int | None]:
    return (url.scheme, url.host, url.port)


async def _read_tail(response: aiohttp.ClientResponse, tail: Tail) -> int:
    """Stream the body into the tail; its size, or -1 when it passed the cap."""
    size = 0
    async for chunk in response.content.iter_chunked(65536):
        size += len(chunk)
        tail.add(chunk)
        if size > HTTP_BODY_LIMIT:
            return -1
    return size


async def _run_http(
    spec: HttpSpec, context: RunContext, timeout: timedelta, secrets: dict[str, str]
) -> ExecutionResult:
    start = time.monotonic()
    try:
        # The run's whole deadline: connecting, redirects and reading the body.
        async with asyncio.timeout(timeout.total_seconds()):
            return await _exchange(spec, context, secrets, start, timeout)
    except TimeoutError:
        return ExecutionResult(
            Outcome.TIMED_OUT, error=f"timed out after {timeout}", duration=elapsed(start)
        )
    except (aiohttp.ClientError, ValueError) as exc:
        return ExecutionResult(
            Outcome.FAILED, error=f"request failed: {exc!r}"[:1000], duration=elapsed(start)
        )


async def _exchange(
    spec: HttpSpec, context: RunContext, secrets: dict[str, str], start: float, timeout: timedelta
) -> ExecutionResult:
    """The request, its same-origin redirects followed; the body's tail kept, capped."""
    values = context.template_values()
    headers = {**spec.headers, **secrets, **context.headers()}
    method = spec.method
    body = None if spec.body is None else fill(spec.body, values)
    url = URL(fill(spec.url, values))
    first = _origin(url)
    # aiohttp's own default (5 minutes in all) must not cut a longer run short.
    limit = aiohttp.ClientTimeout(total=timeout.total_seconds())
    async with aiohttp.ClientSession(timeout=limit) as session:
        for _ in range(MAX_REDIRECTS + 1):
            async with session.request(
                method, url, headers=headers, data=body, allow_redirects=False
            ) as response:
                location = response.headers.get("Location")
                if response.status in _REDIRECTS and location:
                    target = url.join(URL(location))
                    if _origin(target) == first:
                        if response.status == 303:
                            method, body = "GET", None
                        url = target
                        continue
                    # Another origin: not followed, so the secret headers never
                    # reach a host the job did not name.
                    return ExecutionResult(
                        Outcome.FAILED,
                        exit_code=response.status,
                        error=(
                            f"HTTP {response.status}: a redirect to another origin "
                            f"({target.scheme}://{target.host}:{target.port}) is not followed"
                        ),
                        duration=elapsed(start),
                    )
                tail = Tail()
                size = await _read_tail(response, tail)
                if size < 0:
                    return ExecutionResult(
                        Outcome.FAILED,
                        exit_code=response.status,
                        error=f"HTTP {response.status}: response body over "
                        f"{HTTP_BODY_LIMIT} bytes; reading stopped",
                        output_tail=tail.text(),
                        duration=elapsed(start),
                    )
                if response.status in spec.expect_status:
                    return ExecutionResult(
                        Outcome.SUCCEEDED,
                        exit_code=response.status,
                        output_tail=tail.text(),
                        duration=elapsed(start),
                    )
                return ExecutionResult(
                    Outcome.FAILED,
                    exit_code=response.status,
                    error=f"HTTP {response.status}",
                    output_tail=tail.text(),
                    duration=elapsed(start),
                )
    return ExecutionResult(
        Outcome.FAILED,
        error=f"more than {MAX_REDIRECTS} redirects",
        duration=elapsed(start),
    )
