"""The database for a short-lived client (the operator's commands): a small pool, and the
driver's errors sorted by what the client tells its user.

The command line reaches PostgreSQL only through here (and the operator's port on it,
actors.adapters.postgres.operator_store), so it names no driver.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import asyncpg

from actors.observability import redact

Pool: TypeAlias = asyncpg.Pool

# The command's statement met a database without our tables: run `claimd migrate`.
SCHEMA_MISSING: tuple[type[BaseException], ...] = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
)
# The connection went away under the command.
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
)
# Any other refusal by the server.
DATABASE_ERROR: tuple[type[BaseException], ...] = (asyncpg.PostgresError,)


class DatabaseUrlInvalid(Exception):
    """The URL cannot name a database; the message says why, with the URL redacted."""


class DatabaseUnreachable(Exception):
    """No connection within the timeout; the message gives the reason in one line."""


async def open_pool(url: str, timeout: float) -> Pool:
    """A small pool, or one of the errors above within ``timeout`` seconds."""
    where = redact(url)
    try:
        pool = await asyncio.wait_for(
            asyncpg.create_pool(
                url, min_size=1, max_size=4, timeout=timeout, command_timeout=max(30.0, timeout)
            ),
            timeout + 1,
        )
    except (ValueError, asyncpg.ClientConfigurationError) as exc:
        raise DatabaseUrlInvalid(f"{where} is not a usable database URL: {exc}") from None
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {timeout:g}s"
        raise DatabaseUnreachable(f"cannot reach the database at {where}: {reason}") from None
    assert pool is not None
    return pool
