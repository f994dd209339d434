"""Jobs alike share their schedule, parsed expression, executor, policy and durations."""

from __future__ import annotations

import gc
import weakref

from actors.config import parse_config
from actors.domain import (
    CronSchedule,
    PythonSpec,
    ShellSpec,
    decode_job,
    encode_job,
    parse_cron,
    shared,
)


def test_jobs_on_one_expression_and_zone_share_one_schedule_and_its_parsed_cron() -> None:
    jobs = parse_config(
        '[jobs.a]\ncron = "*/5 * * * *"\nrun = { python = "m:f" }\n'
        '[jobs.b]\ncron = "*/5 * * * *"\nrun = { python = "m:f" }\n'
        '[jobs.c]\ncron = "*/5 * * * *"\ntimezone = "Asia/Tokyo"\nrun = { python = "m:f" }\n',
        "<test>",
        env={},
    ).jobs
    a, b, c = jobs["a"], jobs["b"], jobs["c"]
    assert a.schedule is b.schedule
    assert a.executor is b.executor
    assert a.retry is b.retry
    assert a.timeout is b.timeout
    # Another zone is another schedule, on the same parsed expression.
    assert c.schedule is not a.schedule
    assert c.schedule == CronSchedule("*/5 * * * *", "Asia/Tokyo")
    assert isinstance(c.schedule, CronSchedule)
    assert isinstance(a.schedule, CronSchedule)
    assert c.schedule.cron is a.schedule.cron
    # The materializer's decoded jobs share the config's.
    decoded = decode_job("a", encode_job(a))
    assert decoded == a
    assert decoded.schedule is a.schedule
    assert decoded.executor is a.executor
    assert decoded.retry is a.retry


def test_a_shared_value_is_forgotten_once_nothing_uses_it() -> None:
    spec = shared(PythonSpec("only.here:once"))
    assert shared(PythonSpec("only.here:once")) is spec
    held = weakref.ref(spec)
    del spec
    gc.collect()
    assert held() is None  # the table did not keep it alive
    again = PythonSpec("only.here:once")
    assert shared(again) is again
    assert parse_cron("1 2 3 4 *") is parse_cron("1 2 3 4 *")


def test_values_that_cannot_be_hashed_are_not_shared_and_still_work() -> None:
    spec = ShellSpec(argv=("/bin/true",), env={"K": "v"})
    assert shared(spec) is spec
    assert shared(ShellSpec(argv=("/bin/true",), env={"K": "v"})) is not spec
    jobs = parse_config(
        '[jobs.a]\ncron = "* * * * *"\nrun = { shell = ["/bin/true"], env = { K = "v" } }\n'
        '[jobs.b]\ncron = "* * * * *"\nrun = { shell = ["/bin/true"], env = { K = "w" } }\n',
        "<test>",
        env={},
    ).jobs
    assert jobs["a"].executor != jobs["b"].executor
    assert jobs["a"].schedule is jobs["b"].schedule
