"""Errors of the domain. Each says what is wrong in words an operator can act on."""

from __future__ import annotations


class ClaimdError(Exception):
    """Base of every error claimd raises on purpose."""


class InvalidSchedule(ClaimdError):
    """A cron expression, interval or time zone that cannot describe instants."""


class InvalidDuration(ClaimdError):
    """A duration string that is not ``<number><unit>`` with a positive value."""


class LeaseInvariantViolated(ClaimdError):
    """Settings under which the reaper could re-dispatch a run that is still delivered."""


class IllegalTransition(ClaimdError):
    """A run state change the state machine does not allow."""
