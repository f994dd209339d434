"""The notification outbox on real PostgreSQL: the verdict's trigger, the scans, the claim.

What the e2e tests (tests/e2e/test_notifications.py) show through real replicas
and receivers is decided here, statement by statement: one row per (run,
event, sink) whoever writes it, failure tolerance, recovered only after a
notified failure, missed once per instant, a lost sender's attempt on record.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres.notifications import PostgresNotificationStore
from actors.domain.notify import ALL_EVENTS, NotifyEvent, NotifyPolicy
from actors.ports.notify import SendResult
from tests.integration.helpers import add_job, eventually, insert_due_runs, make_job

pytestmark = pytest.mark.integration


async def outbox(store: PostgresRunStore) -> list[tuple[str, str, str]]:
    rows = await store.pool.fetch(
        "SELECT run_id::text AS run_id, event, sink FROM notification_outbox ORDER BY id"
    )
    return [(r["run_id"], r["event"], r["sink"]) for r in rows]


async def verdict(store: PostgresRunStore, run_id: str, state: str) -> None:
    """A run's verdict as the worker or the reaper writes it (the trigger notes either),
    then judged as a notifier does."""
    await store.pool.execute(
        "UPDATE job_runs SET state = $2, finished_at = now() WHERE id = $1::uuid", run_id, state
    )
    await PostgresNotificationStore(store.pool).judge_verdicts(100)


async def test_failed_once_per_streak_and_recovered_after_it(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("flaky"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies([NotifyPolicy("flaky", ("ops", "mail"), ALL_EVENTS)])
    runs = await insert_due_runs(store, job_id, 5)

    await verdict(store, runs[0], "succeeded")  # nothing failed yet: no recovered
    assert await outbox(store) == []
    await verdict(store, runs[1], "failed")
    await verdict(store, runs[2], "failed")  # the same streak, no realert: nothing new
    await verdict(store, runs[3], "succeeded")
    await verdict(store, runs[4], "succeeded")  # already recovered
    assert sorted(await outbox(store)) == sorted(
        [
            (runs[1], "failed", "ops"),
            (runs[1], "failed", "mail"),
            (runs[3], "recovered", "ops"),
            (runs[3], "recovered", "mail"),
        ]
    )


async def test_failure_tolerance_counts_failures_in_a_row(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("nightly"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies(
        [NotifyPolicy("nightly", ("ops",), (NotifyEvent.FAILED,), failure_tolerance=2)]
    )
    runs = await insert_due_runs(store, job_id, 4)
    await verdict(store, runs[0], "failed")
    await verdict(store, runs[1], "succeeded")  # the streak starts again
    await verdict(store, runs[2], "failed")
    assert await outbox(store) == []
    await verdict(store, runs[3], "failed")
    assert await outbox(store) == [(runs[3], "failed", "ops")]


async def test_a_job_without_a_policy_writes_nothing(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("quiet"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies([NotifyPolicy("other", ("ops",))])
    (run,) = await insert_due_runs(store, job_id, 1)
    await verdict(store, run, "failed")
    assert await outbox(store) == []


async def test_missed_once_per_instant_whoever_scans(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("daily"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies([NotifyPolicy("daily", ("ops",), deadline=timedelta(seconds=30))])
    await store.pool.execute("UPDATE notify_policies SET since = now() - interval '1 day'")
    on_time, late, never, failed = await store.pool.fetch(
        """INSERT INTO job_runs (job_id, scheduled_at, due_at)
               SELECT $1, now() - s * interval '1 minute', now() - s * interval '1 minute'
                 FROM generate_series(1, 4) AS s
               RETURNING id::text""",
        job_id,
    )
    await store.pool.execute(
        """UPDATE job_runs SET state = 'succeeded',
                  finished_at = scheduled_at + CASE WHEN id = $1::uuid THEN interval '1 s'
                                                    ELSE interval '50 s' END
            WHERE id = ANY($2::uuid[])""",
        on_time["id"],
        [on_time["id"], late["id"]],
    )
    await store.pool.execute(
        "UPDATE job_runs SET state = 'failed', finished_at = now() WHERE id = $1::uuid",
        failed["id"],
    )
    # Two replicas' scans, the second finding nothing new.
    assert await notes.scan_missed(timedelta(hours=1)) == 2
    version = await store.pool.fetchval("SELECT xmin::text FROM notify_policies")
    assert await notes.scan_missed(timedelta(hours=1)) == 0
    # ... and not writing the policy row again (its mark moves once it lags a minute).
    assert await store.pool.fetchval("SELECT xmin::text FROM notify_policies") == version
    missed = [r for r, event, _ in await outbox(store) if event == "missed"]
    assert sorted(missed) == sorted([late["id"], never["id"]])
    # Its watermark moved: an instant newly past its deadline is the next tick's only work.
    assert await store.pool.fetchval("SELECT missed_until IS NOT NULL FROM notify_policies")


async def test_too_long_once_per_run(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("slow"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies(
        [NotifyPolicy("slow", ("ops",), (NotifyEvent.TOO_LONG,), too_long=timedelta(seconds=1))]
    )
    (run,) = await insert_due_runs(store, job_id, 1)
    await store.pool.execute(
        """UPDATE job_runs SET state = 'running', started_at = now() - interval '5 s',
                  lease_owner = 'w', lease_expires_at = now() + interval '1 minute'
            WHERE id = $1::uuid""",
        run,
    )
    assert await notes.scan_too_long() == 1
    assert await notes.scan_too_long() == 0
    assert await outbox(store) == [(run, "too_long", "ops")]


async def test_verdicts_judged_by_two_notifiers_at_once_owe_each_event_once(
    store: PostgresRunStore,
) -> None:
    names = [f"job{i}" for i in range(4)]
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies([NotifyPolicy(n, ("ops",)) for n in names])
    runs = []
    for name in names:
        runs.extend(await insert_due_runs(store, await add_job(store, make_job(name)), 3))
    # Every job: failed, failed, succeeded; each round one statement (a completion batch).
    for n, state in ((1, "failed"), (2, "failed"), (3, "succeeded")):
        await store.pool.execute(
            """UPDATE job_runs r SET state = $2, finished_at = now()
                 FROM (SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY scheduled_at)
                              AS n FROM job_runs) AS o
                WHERE o.id = r.id AND o.n = $1""",
            n,
            state,
        )
    judged = await asyncio.gather(*(notes.judge_verdicts(2) for _ in range(8)))
    while await notes.judge_verdicts(5):
        pass
    assert sum(judged) <= 12
    events = [event for _, event, _ in await outbox(store)]
    assert sorted(events) == ["failed"] * 4 + ["recovered"] * 4
    assert await store.pool.fetchval("SELECT count(*) FROM notify_verdicts") == 0


async def test_claims_are_disjoint_and_a_dead_sender_attempt_is_recorded_lost(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job("flaky"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies([NotifyPolicy("flaky", ("ops",))])
    (run,) = await insert_due_runs(store, job_id, 1)
    await verdict(store, run, "failed")

    first = await notes.claim("a", 10, timedelta(milliseconds=200))
    assert [n.run_id for n in first] == [run]
    assert first[0].run_state == "failed"
    assert await notes.claim("b", 10, timedelta(seconds=30)) == []  # leased to a

    async def recovered() -> bool:
        return await notes.recover_expired(10) == 1

    await eventually(recovered, what="a's lease to expire and be recovered")
    (again,) = await notes.claim("b", 10, timedelta(seconds=30))
    assert again.attempt == 2
    # a answers late: its attempt is recorded, the row is not moved (fenced).
    late = SendResult(delivered=True, status=200)
    assert await notes.record("a", first[0], late, timedelta(0), 10) is None
    failed = SendResult(delivered=False, status=500, reply="oops", error="HTTP 500")
    assert await notes.record("b", again, failed, timedelta(0), 10) == "pending"
    (third,) = await notes.claim("b", 10, timedelta(seconds=30))
    assert await notes.record("b", third, late, timedelta(0), 10) == "sent"

    (record,) = await notes.list(None, 10)
    assert record.state == "sent"
    assert [(a["attempt"], a["outcome"], a["status"], a["sender"]) for a in record.attempt_log] == [
        (1, "delivered", 200, "a"),  # lost first, then its late answer replaced it
        (2, "failed", 500, "b"),
        (3, "delivered", 200, "b"),
    ]
    figures = await notes.figures()
    assert (figures.pending, figures.dead) == (0, 0)


async def test_realert_sends_failed_again_while_the_job_keeps_failing(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job("stubborn"))
    notes = PostgresNotificationStore(store.pool)
    await notes.sync_policies(
        [NotifyPolicy("stubborn", ("ops",), (NotifyEvent.FAILED,), realert=timedelta(hours=1))]
    )
    runs = await insert_due_runs(store, job_id, 3)
    await verdict(store, runs[0], "failed")
    await verdict(store, runs[1], "failed")  # within the hour: nothing new
    # An hour later (the last alert moved back rather than waited for):
    await store.pool.execute(
        "UPDATE notify_job_state SET last_alert_at = now() - interval '61 minutes'"
    )
    await verdict(store, runs[2], "failed")
    assert sorted(await outbox(store)) == sorted(
        [(runs[0], "failed", "ops"), (runs[2], "failed", "ops")]
    )
