"""The lease invariant: settings under which the reaper could cause duplicates are refused."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from actors.config import ConfigError, parse_config
from actors.domain import (
    DEFAULT_LEASE,
    LeaseInvariantViolated,
    LeaseSettings,
    check_lease_invariant,
)
from actors.domain.lease import stall_after

S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("lease", "ack_wait", "max_deliver", "numbers"),
    [
        # (lease, ack_wait, max_deliver, the numbers the message must show)
        (10 * S, 5 * S, 5, "5s x 4 x 3 = 1m, but lease = 10s"),
        (60 * S, 5 * S, 5, "5s x 4 x 3 = 1m, but lease = 1m"),  # equal is not greater
        (30 * S, 10 * S, 2, "10s x 1 x 3 = 30s, but lease = 30s"),
        (170 * S, 30 * S, 3, "30s x 2 x 3 = 3m, but lease = 170s"),
        (timedelta(minutes=9), timedelta(minutes=1), 4, "1m x 3 x 3 = 9m, but lease = 9m"),
        (
            timedelta(milliseconds=1500),
            timedelta(milliseconds=500),
            2,
            "500ms x 1 x 3 = 1500ms, but lease = 1500ms",
        ),
    ],
)
def test_danger_zone_is_refused_with_the_numbers(
    lease: timedelta, ack_wait: timedelta, max_deliver: int, numbers: str
) -> None:
    settings = LeaseSettings(lease=lease, ack_wait=ack_wait, max_deliver=max_deliver)
    with pytest.raises(LeaseInvariantViolated) as info:
        check_lease_invariant(settings)
    message = str(info.value)
    assert "danger zone" in message
    assert "ack_wait x (max_deliver - 1) x 3" in message
    assert numbers in message


@pytest.mark.parametrize(
    ("lease", "ack_wait", "max_deliver"),
    [
        (61 * S, 5 * S, 5),  # just above the minimum
        (120 * S, 5 * S, 5),  # the defaults
        (S, 30 * S, 1),  # no redelivery at all: any positive lease will do
        (timedelta(hours=1), timedelta(minutes=1), 20),
    ],
)
def test_outside_the_danger_zone_passes(
    lease: timedelta, ack_wait: timedelta, max_deliver: int
) -> None:
    settings = LeaseSettings(lease=lease, ack_wait=ack_wait, max_deliver=max_deliver)
    check_lease_invariant(settings)
    assert settings.lease > settings.minimum_lease()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            LeaseSettings(lease=120 * S, ack_wait=5 * S, max_deliver=0),
            "max_deliver must be at least 1",
        ),
        (LeaseSettings(lease=120 * S, ack_wait=timedelta(0), max_deliver=5), "greater than zero"),
        (LeaseSettings(lease=-S, ack_wait=5 * S, max_deliver=1), "greater than zero"),
    ],
)
def test_nonsense_settings_are_refused(settings: LeaseSettings, message: str) -> None:
    with pytest.raises(LeaseInvariantViolated, match=message):
        check_lease_invariant(settings)


def test_defaults_pass_and_keep_a_margin() -> None:
    check_lease_invariant(DEFAULT_LEASE)
    assert DEFAULT_LEASE.redelivery_span() == 20 * S
    assert DEFAULT_LEASE.minimum_lease() == 60 * S
    assert DEFAULT_LEASE.lease == 120 * S
    # Heartbeats keep both the lease and the broker's ack_wait alive.
    assert DEFAULT_LEASE.heartbeat_interval() == timedelta(milliseconds=2500)


def test_config_defaults_pass() -> None:
    loaded = parse_config("", "claimd.toml", env={})
    assert loaded.settings.lease_settings == DEFAULT_LEASE
    check_lease_invariant(loaded.settings.lease_settings)


def test_config_in_the_danger_zone_is_refused_naming_file_and_field() -> None:
    text = '[claimd]\nlease = "10s"\nack_wait = "5s"\nmax_deliver = 5\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/claimd/claimd.toml", env={})
    err = info.value
    assert err.path == "/etc/claimd/claimd.toml"
    assert err.field_name == "claimd.lease"
    assert err.job is None
    message = str(err)
    assert message.startswith("/etc/claimd/claimd.toml: field 'claimd.lease': ")
    assert "5s x 4 x 3 = 1m, but lease = 10s" in message


def test_config_raising_max_deliver_alone_can_break_the_invariant() -> None:
    # The default lease (120s) with ack_wait 5s: max_deliver 9 needs > 120s.
    parse_config("[claimd]\nmax_deliver = 8\n", "c.toml", env={})
    with pytest.raises(ConfigError, match=re.escape("5s x 8 x 3 = 2m, but lease = 2m")):
        parse_config("[claimd]\nmax_deliver = 9\n", "c.toml", env={})


def test_every_duration_a_worker_and_the_stream_take_from_the_lease() -> None:
    lease = LeaseSettings(timedelta(seconds=120), timedelta(seconds=6), 5)
    assert lease.keep_held_alive() == timedelta(seconds=2)  # ack_wait / 3
    assert stall_after(lease.lease) == timedelta(seconds=30)  # lease / 4
    assert stall_after(timedelta(seconds=2)) == timedelta(seconds=1)  # a second at least
    assert lease.stream_max_age(timedelta(minutes=2)) == timedelta(minutes=4)  # two leases
    assert lease.stream_max_age(timedelta(minutes=10)) == timedelta(minutes=10)
