"""Redaction of every credential form, the log formats, library logs as JSON, the CLI's options."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from actors.cli.main import build_parser
from actors.observability import configure_logging, get_logger, redact, resolve_log_format

SECRET = "s3cr3t-Pw"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # user:password@ in any scheme, single and multi-host
        (f"postgresql://claimd:{SECRET}@db:5432/claimd", "postgresql://claimd:***@db:5432/claimd"),
        (
            f"postgres://u:{SECRET}@h1:5432,h2:5432/db?target_session_attrs=read-write",
            "postgres://u:***@h1:5432,h2:5432/db?target_session_attrs=read-write",
        ),
        (
            f"nats://app:{SECRET}@n1:4222,nats://app:{SECRET}@n2:4222",
            "nats://app:***@n1:4222,nats://app:***@n2:4222",
        ),
        (f"tls://app:{SECRET}@nats.internal:4222", "tls://app:***@nats.internal:4222"),
        (f"https://bot:{SECRET}@hooks.internal/x", "https://bot:***@hooks.internal/x"),
        # NATS token form: the whole user part is the token
        (f"nats://{SECRET}@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
        (f"connecting to tls://{SECRET}@n1:4222 failed", "connecting to tls://***@n1:4222 failed"),
        # query parameters
        (
            f"postgresql://db/claimd?user=claimd&password={SECRET}&sslmode=require",
            "postgresql://db/claimd?user=claimd&password=***&sslmode=require",
        ),
        (f"postgresql://db/claimd?password={SECRET}", "postgresql://db/claimd?password=***"),
        (
            f"https://api.internal/hook?token={SECRET}&x=1",
            "https://api.internal/hook?token=***&x=1",
        ),
        (f"postgresql://db/c?sslpassword={SECRET}", "postgresql://db/c?sslpassword=***"),
        # key-value DSNs (libpq style), quoted or not
        (
            f"host=db user=claimd password={SECRET} dbname=claimd",
            "host=db user=claimd password=*** dbname=claimd",
        ),
        ("host=db password='with space' dbname=c", "host=db password=*** dbname=c"),
        (f"host=db PASSWORD = {SECRET}", "host=db PASSWORD = ***"),
        # headers
        (f"Authorization: Bearer {SECRET}xyz", "Authorization: Bearer ***"),
    ],
)
def test_every_credential_form_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert SECRET not in redact(text)
    assert redact(redact(text)) == expected  # idempotent: a redacted text stays as it is


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://postgres@127.0.0.1:5432/postgres",  # a user name is not a secret
        "postgresql://claimd@db/claimd?sslmode=verify-full&sslrootcert=/etc/ca.pem",
        "nats://127.0.0.1:4222",
        "run finished outcome=failed exit_code=1",
        'password authentication failed for user "claimd"',
    ],
)
def test_text_without_credentials_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # An earlier configure_logging left warnings captured, saving pytest's own
    # showwarning of that test: start from the current one.
    logging.captureWarnings(False)
    yield
    root.handlers, root.level = handlers, level
    logging.captureWarnings(False)
    structlog.reset_defaults()


def test_library_logs_with_tracebacks_are_one_json_line_each(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json")
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError as exc:
        # What nats-py's default error callback does when the connection drops.
        logging.getLogger("nats.aio.client").error("nats: encountered error", exc_info=exc)
    logging.getLogger("asyncio").error(
        "Task exception was never retrieved", exc_info=(ValueError, ValueError("x"), None)
    )
    logging.getLogger("asyncpg.pool").warning(f"reconnecting to postgresql://u:{SECRET}@db/x")
    logging.getLogger("aiohttp.server").error("Error handling request")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library warning", RuntimeWarning, stacklevel=1)
    get_logger("worker").error(
        "run failed; no attempts left",
        run_id="r1",
        job="j",
        error=f"exit status 1 (nats://{SECRET}@h)",
    )
    lines = capsys.readouterr().err.splitlines()
    events = [json.loads(line) for line in lines]  # raises on any raw (non-JSON) line
    assert [e.get("logger", e.get("actor")) for e in events] == [
        "nats.aio.client",
        "asyncio",
        "asyncpg.pool",
        "aiohttp.server",
        "py.warnings",
        "worker",
    ]
    assert "ConnectionResetError" in events[0]["exception"]
    assert "Traceback" in events[0]["exception"]
    assert events[0]["level"] == "error"
    assert SECRET not in "\n".join(lines)
    assert events[5]["error"] == "exit status 1 (nats://***@h)"


def test_console_format_is_for_people(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "console")
    get_logger("worker").warning("run attempt failed; will retry", job="j")
    logging.getLogger("nats.aio.client").warning("nats: reconnecting")
    err = capsys.readouterr().err
    assert "run attempt failed; will retry" in err
    assert "job=j" in err
    assert not err.lstrip().startswith("{")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_console_on_a_terminal_and_json_otherwise() -> None:
    assert resolve_log_format("auto", _Tty()) == "console"
    assert resolve_log_format("auto", io.StringIO()) == "json"
    assert resolve_log_format("json", _Tty()) == "json"
    assert resolve_log_format("console", io.StringIO()) == "console"


@pytest.mark.parametrize(
    ("argv", "fmt", "level"),
    [
        (["run", "--config", "c.toml"], "auto", "INFO"),
        (["--log-format", "console", "run", "--config", "c.toml"], "console", "INFO"),
        (["run", "--config", "c.toml", "--log-format", "json"], "json", "INFO"),
        (["--console-logs", "run", "--config", "c.toml"], "console", "INFO"),
        (["run", "--console-logs", "--config", "c.toml"], "console", "INFO"),
        (["migrate", "--log-level", "WARNING", "--database-url", "x"], "auto", "WARNING"),
        (
            ["--log-format", "console", "check-config", "f.toml", "--log-format", "json"],
            "json",
            "INFO",
        ),
        (
            ["backfill", "j", "--from", "a", "--to", "b", "--log-format", "console"],
            "console",
            "INFO",
        ),
    ],
)
def test_logging_options_are_accepted_before_or_after_the_subcommand(
    argv: list[str], fmt: str, level: str
) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_format, args.log_level) == (fmt, level)


def test_an_unknown_log_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--config", "c", "--log-format", "xml"])
    assert exit_.value.code == 2
    assert "--log-format" in capsys.readouterr().err
