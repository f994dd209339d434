"""Where the tests' PostgreSQL and NATS come from.

``CLAIMD_TEST_DATABASE_URL`` / ``CLAIMD_TEST_NATS_URL`` when set (CI points
them at the machine's running services); otherwise embedded servers started
once per test session. Every test gets its own schema and its own stream, so
tests never see each other's rows or messages.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_embedded: dict[str, object] = {}


def database_url() -> str:
    url = os.environ.get("CLAIMD_TEST_DATABASE_URL")
    if url:
        return url
    if "pg" not in _embedded:
        from actors.adapters.embedded import start_postgres

        _embedded["pg"] = start_postgres(Path(tempfile.mkdtemp(prefix="claimd-test-pg-")))
    return _embedded["pg"].url  # type: ignore[attr-defined,no-any-return]


def nats_url() -> str:
    url = os.environ.get("CLAIMD_TEST_NATS_URL")
    if url:
        return url
    if "nats" not in _embedded:
        from actors.adapters.embedded import start_nats

        _embedded["nats"] = start_nats(Path(tempfile.mkdtemp(prefix="claimd-test-nats-")))
    return _embedded["nats"].url  # type: ignore[attr-defined,no-any-return]


def stop_embedded() -> None:
    for server in _embedded.values():
        server.stop()  # type: ignore[attr-defined]
    _embedded.clear()


def with_search_path(url: str, schema: str) -> str:
    """The same database URL, with its connections confined to ``schema``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def unique_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"
