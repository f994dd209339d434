"""The http executor: one request with the run in its headers (Idempotency-Key)."""

from __future__ import annotations

import time
from datetime import timedelta

import aiohttp

from actors.adapters.executors.common import (
    OUTPUT_TAIL_BYTES,
    MissingSecret,
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


async def run_http(spec: HttpSpec, context: RunContext, timeout: timedelta) -> ExecutionResult:
    """Send the request with the run's identity as headers (``Idempotency-Key``)."""
    try:
        secrets = resolve_secrets(spec.secret_headers)
    except MissingSecret as exc:
        return ExecutionResult(Outcome.FAILED, error=str(exc))
    return scrub(await _run_http(spec, context, timeout, secrets), secrets.values())


async def _run_http(
    spec: HttpSpec, context: RunContext, timeout: timedelta, secrets: dict[str, str]
) -> ExecutionResult:
    start = time.monotonic()
    values = context.template_values()
    headers = {**spec.headers, **secrets, **context.headers()}
    body = None if spec.body is None else fill(spec.body, values)
    try:
        async with (
            aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout.total_seconds())
            ) as session,
            session.request(
                spec.method, fill(spec.url, values), headers=headers, data=body
            ) as response,
        ):
            text = (await response.text(errors="replace"))[-OUTPUT_TAIL_BYTES:]
            if response.status in spec.expect_status:
                return ExecutionResult(
                    Outcome.SUCCEEDED,
                    exit_code=response.status,
                    output_tail=text,
                    duration=elapsed(start),
                )
            return ExecutionResult(
                Outcome.FAILED,
                exit_code=response.status,
                error=f"HTTP {response.status}",
                output_tail=text,
                duration=elapsed(start),
            )
    except TimeoutError:
        return ExecutionResult(
            Outcome.TIMED_OUT, error=f"timed out after {timeout}", duration=elapsed(start)
        )
    except aiohttp.ClientError as exc:
        return ExecutionResult(
            Outcome.FAILED, error=f"request failed: {exc!r}"[:1000], duration=elapsed(start)
        )
