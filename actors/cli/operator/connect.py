"""How an operator command reaches claimd: the database directly, or a replica's HTTP API.

Resolution, first match wins: ``--url`` (or ``CLAIMD_URL``) goes through the
API; ``--database-url``, ``CLAIMD_DATABASE_URL`` or ``--config`` reach the
database; with none of these, a running ``claimd dev`` of this working
directory is found through the file it writes in its data folder (``./.claimd``,
or the folder ``--data-dir`` names, as ``claimd dev --data-dir`` does).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from pydantic import TypeAdapter

from actors.config import ConfigError, database_url_of
from actors.domain.backfill import BACKFILL_CHUNK, BackfillProgress
from actors.http.openapi import BY_ID
from actors.operator import (
    BadInput,
    Forbidden,
    NotFound,
    NothingToDo,
    OperatorError,
    OperatorService,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from actors.operator.models import (
    Audit,
    ConfigRollout,
    Job,
    JobDetail,
    RejectedJob,
    RunDetail,
    RunsPage,
)
from actors.ports import Caller, OperatorStore

ENDPOINTS_FILE = "endpoints.json"
_BY_STATUS: dict[int, type[OperatorError]] = {
    400: BadInput,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: NothingToDo,
    422: Unprocessable,
}


# Opens the operator's store on a database URL within a timeout, or raises BadInput
# (the URL names no database) or Unavailable (no answer). The composition root
# that names the adapter (actors.cli.operator_store) hands it to ``register``.
StoreOpener = Callable[[str, float], Awaitable[OperatorStore]]


class Backend(Protocol):
    """The operations every command uses, whichever way it reached claimd."""

    async def get(self, what: str, **params: Any) -> Any: ...
    async def act(self, action: str, **params: Any) -> dict[str, Any]: ...
    async def close(self) -> None: ...


def os_user() -> str:
    with contextlib.suppress(Exception):
        return getpass.getuser()
    return f"uid:{os.getuid()}"


# --- claimd dev's endpoints file ------------------------------------------------------


def record_dev_endpoints(
    data_dir: Path, database_url: str, nats_url: str, http_url: str | None
) -> Path:
    """Written by `claimd dev`: how operator commands of this directory reach it."""
    path = data_dir / ENDPOINTS_FILE
    path.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "database_url": database_url,
                "nats_url": nats_url,
                "http_url": http_url,
            },
            indent=2,
        )
    )
    path.chmod(0o600)
    return path


def forget_dev_endpoints(path: Path) -> None:
    with contextlib.suppress(OSError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def dev_database_url(data_dir: Path) -> str | None:
    """The database of a running `claimd dev` in ``data_dir``, if there is one."""
    path = data_dir / ENDPOINTS_FILE
    try:
        recorded = json.loads(path.read_text())
        pid, url = int(recorded["pid"]), str(recorded["database_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise Unavailable(
            f"the claimd dev recorded in {path} (pid {pid}) is not running; "
            "start it again or give --config / --database-url / --url"
        ) from None
    except PermissionError:
        pass  # alive, another user's
    return url


def database_url(args: Any) -> str | None:
    """The database the arguments point at, the one resolver of every command.

    First match wins: ``--database-url``, ``CLAIMD_DATABASE_URL``, the ``--config``
    file's (with its environment overrides), a running `claimd dev` of this
    directory; None when there is none of these.
    """
    url = getattr(args, "database_url", None) or os.environ.get("CLAIMD_DATABASE_URL")
    if url:
        return str(url)
    if getattr(args, "config", None):
        try:  # database_url alone: not the API token's variable, a replica's concern
            return database_url_of(args.config)
        except ConfigError as exc:
            raise BadInput(str(exc)) from None
    return dev_database_url(Path(getattr(args, "dev_dir", ".claimd")))


# --- the database -------------------------------------------------------------------


async def connect_database(args: Any, url: str) -> OperatorStore:
    """The operator's store on ``url``, or BadInput / Unavailable within the connect
    timeout, in one line (through the opener ``register`` was given)."""
    open_store: StoreOpener | None = getattr(args, "open_store", None)
    if open_store is None:
        raise Unavailable("no database adapter is wired into this command")
    return await open_store(url, float(getattr(args, "connect_timeout", 5.0)))


def print_backfill_progress(done: BackfillProgress) -> None:
    """One stderr line per chunk of a backfill longer than one chunk."""
    if done.instants <= BACKFILL_CHUNK or done.through is None:
        return
    print(
        f"backfill {done.job}: {done.covered:,}/{done.instants:,} instants "
        f"(through {done.through.isoformat()}), {done.added:,} added",
        file=sys.stderr,
    )


class DatabaseBackend:
    """Straight to the store (PostgreSQL), through the same service the API uses."""

    def __init__(self, store: OperatorStore, actor: Caller) -> None:
        self.store = store
        self.service = OperatorService(store)
        self.actor = actor

    async def get(self, what: str, **params: Any) -> Any:
        return await getattr(self.service, what)(**params)

    async def act(self, action: str, **params: Any) -> dict[str, Any]:
        if action == "backfill":
            params["progress"] = print_backfill_progress
        result: dict[str, Any] = await getattr(self.service, action)(self.actor, **params)
        return result

    async def close(self) -> None:
        await self.store.close()


# --- a replica's HTTP API -----------------------------------------------------------

# What each command asks for, by the operation id of the one route table the
# server and /openapi.json are built from (actors.http.openapi.operations).
_READS = {
    "jobs": "listJobs",
    "job": "getJob",
    "runs": "listRuns",
    "run": "getRun",
    "audit": "auditJob",
    "actions": "listActions",
    "rejected_jobs": "listRejectedJobs",
    "config_rollout": "getConfig",
}
_ACTIONS = {
    "pause": "pauseJob",
    "resume": "resumeJob",
    "trigger": "triggerJob",
    "backfill": "backfillJob",
    "cancel": "cancelRun",
}
# The answers parsed back into the operator's read models.
_PARSED: dict[str, TypeAdapter[Any]] = {
    "listJobs": TypeAdapter(list[Job]),
    "getJob": TypeAdapter(JobDetail),
    "listRuns": TypeAdapter(RunsPage),
    "getRun": TypeAdapter(RunDetail),
    "auditJob": TypeAdapter(Audit),
    "listRejectedJobs": TypeAdapter(list[RejectedJob]),
    "getConfig": TypeAdapter(ConfigRollout),
}
# The commands' names for the table's path parameters.
_PATH_ALIASES = {"name": ("name", "job"), "run_id": ("run_id",)}
_QUERY_NAMES = {"start": "from", "end": "to", "states": "state"}


class HttpBackend:
    """Through a replica's API, the bearer token (if any) sent with every request: reads
    need one of scope read once the replica has tokens, actions one of scope operate."""

    def __init__(self, url: str, token: str | None, actor: str, timeout: float) -> None:
        self.base = url.rstrip("/")
        self.token = token
        self.actor = actor
        # No total limit: a long backfill is one request; connecting is bounded.
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout)
        )

    async def _call(
        self, method: str, path: str, *, params: Any = None, body: dict[str, Any] | None = None
    ) -> Any:
        headers = {"Claimd-Actor": self.actor}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            async with self.session.request(
                method, self.base + path, params=params, json=body, headers=headers
            ) as response:
                try:
                    data = await response.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    data = None
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(
                f"cannot reach the claimd API at {self.base}: {str(exc) or type(exc).__name__}"
            ) from None
        if status < 300 and data is not None:
            return data
        message = data.get("error") if isinstance(data, dict) else None
        error = _BY_STATUS.get(status, Unavailable)
        raise error(f"{message or 'no message'} (HTTP {status} from {self.base})")

    async def get(self, what: str, **params: Any) -> Any:
        operation_id = _READS[what]
        path = _path(operation_id, params)
        query: list[tuple[str, str]] = []
        for key, value in params.items():
            if value is None:
                continue
            name = _QUERY_NAMES.get(key, key)
            if isinstance(value, bool):  # the API's flags are "true" / "false"
                value = "true" if value else "false"
            values = value if isinstance(value, list | tuple) else [value]
            query.extend((name, str(v)) for v in values)
        data = await self._call("GET", path, params=query)
        # The operator's reads come back as the read models the service returns
        # (actors.operator.models): the commands render the same typed values either way.
        model = _PARSED.get(operation_id)
        return data if model is None else model.validate_python(data)

    async def act(self, action: str, **params: Any) -> dict[str, Any]:
        path = _path(_ACTIONS[action], params)
        body = {_QUERY_NAMES.get(k, k): v for k, v in params.items() if v is not None}
        result: dict[str, Any] = await self._call("POST", path, body=body)
        return result

    async def close(self) -> None:
        await self.session.close()


def _path(operation_id: str, params: dict[str, Any]) -> str:
    """The operation's path from the route table, its parameters taken out of ``params``."""
    template = BY_ID[operation_id].path
    values: dict[str, str] = {}
    for name in re.findall(r"{(\w+)}", template):
        given = next(alias for alias in _PATH_ALIASES[name] if alias in params)
        values[name] = _quote(str(params.pop(given)))
    return template.format(**values)


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _token(args: Any) -> str | None:
    token_file = getattr(args, "token_file", None)
    if token_file:
        try:
            return Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise BadInput(f"cannot read {token_file}: {exc.strerror}") from None
    return os.environ.get("CLAIMD_API_TOKEN") or None


async def open_backend(args: Any) -> Backend:
    """The backend the arguments (or the environment, or `claimd dev`) point at."""
    actor = getattr(args, "actor", None) or os_user()
    timeout = float(getattr(args, "connect_timeout", 5.0))
    url = getattr(args, "url", None) or os.environ.get("CLAIMD_URL")
    if url:
        return HttpBackend(url, _token(args), actor, timeout)
    dsn = database_url(args)
    if dsn is None:
        raise BadInput(
            "no claimd to talk to: give --config, --database-url or --url "
            "(or run `claimd dev` in this directory; for a `claimd dev --data-dir DIR`, "
            "give --data-dir DIR)"
        )
    store = await connect_database(args, dsn)
    origin = f"{socket.gethostname()}:{os.getpid()}"
    return DatabaseBackend(store, Caller(name=actor, via="cli", origin=origin))
