"""The composition root of the operator's commands: the one place their store is named.

``actors.cli.operator`` speaks to the operator's port only (an import-linter
contract keeps it so); `claimd` hands it this opener, which builds the
PostgreSQL adapter of that port on a small pool of its own.
"""

from __future__ import annotations

from actors.adapters.database import DatabaseUnreachable, DatabaseUrlInvalid
from actors.adapters.postgres import PostgresOperatorStore
from actors.operator import BadInput, Unavailable
from actors.ports import OperatorStore


async def open_operator_store(url: str, timeout: float) -> OperatorStore:
    """The operator's store on PostgreSQL at ``url``; BadInput or Unavailable in one line."""
    try:
        return await PostgresOperatorStore.open(url, timeout)
    except DatabaseUrlInvalid as exc:
        raise BadInput(str(exc)) from None
    except DatabaseUnreachable as exc:
        raise Unavailable(str(exc)) from None
