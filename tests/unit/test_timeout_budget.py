"""The timeout budget: every deadline derived from the lease, and refused when it does not fit.

``lease > publish_timeout + ack_wait x (max_deliver - 1) + database call``, where a
database call is acquire + statement + release. Settings that break it are
refused at load with the numbers; the derived defaults always fit a lease the
redelivery rule accepts.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.adapters.postgres import split_hosts
from actors.cli.main import build_parser
from actors.config import ConfigError, parse_config
from actors.domain import (
    DEFAULT_TIMEOUTS,
    LeaseInvariantViolated,
    LeaseSettings,
    TimeoutBudget,
    check_lease_invariant,
    check_timeout_budget,
)

S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)
PATH = "/etc/claimd/claimd.toml"


def settings_text(**values: str | int) -> str:
    lines = [f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in values.items()]
    return "[claimd]\n" + "\n".join(lines) + "\n"


# -- must-show 4: timeouts that do not fit the lease are refused with the numbers -----------


@pytest.mark.parametrize(
    ("settings", "numbers"),
    [
        # A statement timeout set by hand that eats the lease.
        (
            {"lease": "60s", "ack_wait": "5s", "max_deliver": 4, "statement_timeout": "20s"},
            "= 5s + 5s x 3 + (10s + 20s + 10s) = 1m, but lease = 1m",
        ),
        # A publish timeout set by hand.
        (
            {"lease": "2m", "ack_wait": "5s", "max_deliver": 5, "publish_timeout": "70s"},
            "= 70s + 5s x 4 + (7500ms + 15s + 7500ms) = 2m, but lease = 2m",
        ),
        # Both, on a lease the redelivery rule alone would accept.
        (
            {
                "lease": "30s",
                "ack_wait": "2s",
                "max_deliver": 3,
                "statement_timeout": "12s",
                "publish_timeout": "3s",
            },
            "= 3s + 2s x 2 + (6s + 12s + 6s) = 31s, but lease = 30s",
        ),
        # A lease so short that the floors (a statement gets at least 500ms) do not fit.
        (
            {"lease": "1s", "ack_wait": "100ms", "max_deliver": 2},
            "= 250ms + 100ms x 1 + (250ms + 500ms + 250ms) = 1350ms, but lease = 1s",
        ),
    ],
)
def test_timeouts_that_do_not_fit_the_lease_are_refused_with_the_numbers(
    settings: dict[str, str | int], numbers: str
) -> None:
    text = settings_text(**settings)
    with pytest.raises(ConfigError) as info:
        parse_config(text, PATH, env={})
    err = info.value
    assert (err.path, err.field_name, err.job) == (PATH, "claimd.lease", None)
    message = str(err)
    assert "the timeouts do not fit the lease" in message
    assert (
        # (claim_ahead left unset shrinks to what fits: nothing here)
        "publish_timeout + ack_wait x (max_deliver - 1) + database call "
        "(acquire + statement_timeout + release)"
    ) in message
    assert numbers in message, message
    assert "lower statement_timeout, publish_timeout, ack_wait or max_deliver" in message


def test_the_same_timeouts_fit_a_longer_lease() -> None:
    loaded = parse_config(
        settings_text(lease="61s", ack_wait="5s", max_deliver=4, statement_timeout="20s"),
        PATH,
        env={},
    )
    budget = loaded.settings.timeouts
    assert budget.statement_timeout == 20 * S
    assert budget.required_lease() == 60 * S + 500 * MS  # claim_ahead: half the 1s spare
    check_timeout_budget(budget)


def test_the_redelivery_rule_is_still_checked_first() -> None:
    with pytest.raises(ConfigError, match=r"danger zone.*5s x 4 x 3 = 1m, but lease = 10s"):
        parse_config(settings_text(lease="10s", ack_wait="5s", max_deliver=5), PATH, env={})


def test_a_budget_built_by_hand_is_refused_the_same_way() -> None:
    budget = TimeoutBudget.from_settings(
        10 * S, S, 2, statement_timeout=3 * S, publish_timeout=2 * S
    )
    with pytest.raises(
        LeaseInvariantViolated, match=r"= 2s \+ 1s x 1 \+ \(1500ms \+ 3s \+ 1500ms\) = 9s"
    ):
        check_timeout_budget(
            TimeoutBudget.from_settings(8 * S, S, 2, statement_timeout=3 * S, publish_timeout=2 * S)
        )
    check_timeout_budget(budget)  # 9s < 10s


# -- the derived budget ----------------------------------------------------------------------


def test_the_default_budget() -> None:
    b = DEFAULT_TIMEOUTS  # lease 120s, ack_wait 5s, max_deliver 5
    assert (b.statement_timeout, b.acquire_timeout, b.publish_timeout) == (15 * S, 7500 * MS, 5 * S)
    assert (b.connect_timeout, b.close_timeout) == (10 * S, 10 * S)
    assert (b.ping_interval, b.max_outstanding_pings, b.nats_dead_after()) == (10 * S, 2, 30 * S)
    assert (b.keepalive_idle, b.keepalive_interval, b.keepalive_count) == (8 * S, 8 * S, 3)
    assert b.database_dead_after() == 32 * S
    assert b.required_lease() == 60 * S  # with claim_ahead 5s


def test_caps_and_floors() -> None:
    long = TimeoutBudget.from_settings(timedelta(hours=1), timedelta(minutes=1), 20)
    assert (long.statement_timeout, long.publish_timeout, long.connect_timeout) == (
        30 * S,
        5 * S,
        10 * S,
    )
    assert long.nats_dead_after() == 60 * S
    short = TimeoutBudget.from_settings(2 * S, 600 * MS, 2)
    assert (short.statement_timeout, short.acquire_timeout, short.publish_timeout) == (
        500 * MS,
        250 * MS,
        250 * MS,
    )
    # Pings and keepalive take whole seconds: at least one.
    assert (short.ping_interval, short.keepalive_idle) == (S, S)


def test_check_config_lines_show_the_budget() -> None:
    lines = DEFAULT_TIMEOUTS.describe()
    assert lines[0] == (
        "timeouts (from lease 2m): statement 15s, acquire/release 7500ms, "
        "connect 10s, publish 5s, close 10s"
    )
    assert "NATS within 30s (ping every 10s, 2 unanswered)" in lines[1]
    assert "PostgreSQL within 32s" in lines[1]
    assert lines[2].startswith("lease invariant: lease 2m > ")
    assert lines[2].endswith("= 1m")


@given(
    lease_ms=st.integers(2_000, 86_400_000),
    ack_ms=st.integers(1, 600_000),
    max_deliver=st.integers(1, 100),
)
def test_derived_timeouts_fit_every_lease_the_redelivery_rule_accepts(
    lease_ms: int, ack_ms: int, max_deliver: int
) -> None:
    lease, ack_wait = lease_ms * MS, ack_ms * MS
    try:
        check_lease_invariant(LeaseSettings(lease, ack_wait, max_deliver))
    except LeaseInvariantViolated:
        return
    budget = TimeoutBudget.from_settings(lease, ack_wait, max_deliver)
    check_timeout_budget(budget)
    # Every deadline is a fraction of the lease: a silent connection is noticed in time.
    # (whole milliseconds: a few of rounding)
    assert budget.database_call() <= max(lease / 4, 1000 * MS) + 3 * MS
    assert budget.publish_timeout <= max(lease / 8, 250 * MS) + MS
    if lease >= 12 * S:
        assert budget.nats_dead_after() <= lease / 4 + 3 * S
        assert budget.database_dead_after() <= lease / 4 + 4 * S


# -- settings for a cluster --------------------------------------------------------------------


def test_nats_url_takes_a_list_or_commas_and_the_environment_commas() -> None:
    listed = parse_config(
        '[claimd]\nnats_url = ["nats://a:4222", "nats://b:4222"]\nstream_replicas = 3\n',
        PATH,
        env={},
    ).settings
    assert listed.nats_servers == ["nats://a:4222", "nats://b:4222"]
    assert listed.stream_replicas == 3
    commas = parse_config(
        '[claimd]\nnats_url = "nats://a:4222, nats://b:4222"\n', PATH, env={}
    ).settings
    assert commas.nats_servers == ["nats://a:4222", "nats://b:4222"]
    env = parse_config("", PATH, env={"CLAIMD_NATS_URL": "nats://x:1,tls://y:2"}).settings
    assert env.nats_servers == ["nats://x:1", "tls://y:2"]
    assert parse_config("", PATH, env={}).settings.stream_replicas == 1


@pytest.mark.parametrize(
    ("text", "env", "words"),
    [
        ("nats_url = []", {}, "give one or more server URLs"),
        ('nats_url = "nats://a:1,,nats://b:2"', {}, "none empty"),
        ('nats_url = "http://u:secret@a:1"', {}, "'http://u:***@a:1' is not a NATS server URL"),
        ("", {"CLAIMD_NATS_URL": "nats://a:1,b:2"}, "from CLAIMD_NATS_URL: 'b:2' is not a NATS"),
        ("nats_url = 4222", {}, "expected a server URL, a list of them"),
    ],
)
def test_bad_nats_urls_are_refused_naming_the_field(
    text: str, env: dict[str, str], words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[claimd]\n{text}\n", PATH, env=env)
    assert info.value.field_name == "claimd.nats_url"
    assert words in str(info.value)
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("value", [0, 6, '"3"'])
def test_stream_replicas_is_1_to_5(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[claimd]\nstream_replicas = {value}\n", PATH, env={})
    assert info.value.field_name == "claimd.stream_replicas"


@pytest.mark.parametrize(
    ("key", "value"), [("statement_timeout", "0s"), ("publish_timeout", "soon")]
)
def test_timeouts_set_by_hand_are_durations(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'[claimd]\n{key} = "{value}"\n', PATH, env={})
    assert info.value.field_name == f"claimd.{key}"


# -- a multi-host database URL, host by host -------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "hosts"),
    [
        (
            "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write",
            [
                "postgresql://u:p@h1:5432/db?target_session_attrs=read-write",
                "postgresql://u:p@h2:5433/db?target_session_attrs=read-write",
            ],
        ),
        (
            "postgres://h1,[::1]:6000?sslmode=require",
            ["postgres://h1?sslmode=require", "postgres://[::1]:6000?sslmode=require"],
        ),
        ("postgresql://u@h1:5432/db", ["postgresql://u@h1:5432/db"]),
        ("postgresql:///db?host=/run/postgresql", ["postgresql:///db?host=/run/postgresql"]),
        ("host=h1,h2 dbname=db", ["host=h1,h2 dbname=db"]),
    ],
)
def test_split_hosts(dsn: str, hosts: list[str]) -> None:
    assert split_hosts(dsn) == hosts


def test_check_config_prints_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "claimd.toml"
    path.write_text(
        '[claimd]\nlease = "6s"\nack_wait = "1s"\nmax_deliver = 2\n\n'
        '[jobs.beat]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n'
    )
    args = build_parser().parse_args(["check-config", str(path), "--count", "1"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    out = captured.err.splitlines()  # stdout stays the jobs and their fire times
    # claim_ahead's default is capped at lease / 8
    assert out[:3] == TimeoutBudget.from_settings(6 * S, S, 2, claim_ahead=750 * MS).describe()
    assert captured.out.startswith("beat: ")
    assert out[0] == (
        "timeouts (from lease 6s): statement 750ms, acquire/release 375ms, "
        "connect 1s, publish 750ms, close 1s"
    )
    assert out[2].endswith("= 750ms + 750ms + 1s x 1 + (375ms + 750ms + 375ms) = 4s")


# -- claim_ahead: a term of the invariant, at most lease / 8 -------------------------------


def test_claim_ahead_longer_than_a_worker_may_hold_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(settings_text(lease="40s", ack_wait="2s", claim_ahead="6s"), PATH, env={})
    assert info.value.field_name == "claimd.claim_ahead"
    assert "at most lease / 8 = 40s / 8 = 5s" in str(info.value)
    assert "claim_ahead = 6s" in str(info.value)


def test_claim_ahead_set_counts_in_the_lease_sum() -> None:
    # lease 61s fits 60s of the other terms; a claim_ahead of 1s no longer fits.
    text = settings_text(
        lease="61s", ack_wait="5s", max_deliver=4, statement_timeout="20s", claim_ahead="1s"
    )
    with pytest.raises(ConfigError, match=r"= 5s \+ 1s \+ 5s x 3 .* = 61s, but lease = 61s"):
        parse_config(text, PATH, env={})


def test_claim_ahead_unset_shrinks_to_what_fits() -> None:
    # lease 2s, ack_wait 600ms: 150ms spare over the other terms, so 75ms (half of it).
    loaded = parse_config(settings_text(lease="2s", ack_wait="600ms", max_deliver=2), PATH, env={})
    assert loaded.settings.effective_claim_ahead == 75 * MS
    assert parse_config(settings_text(), PATH, env={}).settings.effective_claim_ahead == 5 * S
    zero = parse_config(settings_text(claim_ahead="0s"), PATH, env={}).settings
    assert zero.effective_claim_ahead == timedelta(0)
