"""The one clock: skew measured against the database, and replicas that plan on it agree.

The simulation drives the pure planner as several replicas would, each tick
reading "now" from a clock, planning, and writing a moment later (possibly
stalled), against one shared store with the unique constraint's semantics.
Handed the database's clock they plan every instant once whatever their own
clocks say; handed their own clocks, 10 minutes off, they lose instants and
invent history (the check can fail, and that is what it looks like).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from actors.domain import Catchup, IntervalSchedule, Job, PythonSpec, plan_materialization
from actors.scheduling.database_clock import DatabaseClock
from actors.testing.memory import ManualClock

DB_T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


class Local:
    """A replica's wall clock: the database's plus an offset."""

    def __init__(self, offset: timedelta) -> None:
        self.db = DB_T0
        self.offset = offset

    def now(self) -> datetime:
        return self.db + self.offset


class Monotonic:
    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


class FakeStore:
    """database_now() takes ``round_trip`` seconds of monotonic time; the answer is
    the database's time at the middle of it."""

    def __init__(self, local: Local, mono: Monotonic, round_trip: float) -> None:
        self.local, self.mono, self.round_trip = local, mono, round_trip

    async def database_now(self) -> datetime:
        self.mono.value += self.round_trip / 2
        answer = self.local.db + timedelta(seconds=self.round_trip / 2)
        self.mono.value += self.round_trip / 2
        self.local.db += timedelta(seconds=self.round_trip)
        return answer


def skew_gauge() -> float | None:
    return REGISTRY.get_sample_value("claimd_clock_skew_seconds")


async def test_skew_is_measured_at_the_middle_of_the_round_trip() -> None:
    local, mono = Local(timedelta(minutes=10)), Monotonic()
    clock = DatabaseClock(FakeStore(local, mono, round_trip=0.2), local=local, monotonic=mono)
    db_now = await clock.read()
    assert db_now == DB_T0 + timedelta(seconds=0.1)
    assert clock.skew == timedelta(minutes=10)
    assert skew_gauge() == pytest.approx(600.0)
    # Between reads, the database's time is estimated from the local clock.
    assert clock.now() == local.now() - timedelta(minutes=10)


async def test_a_clock_behind_reads_negative() -> None:
    local, mono = Local(-timedelta(seconds=90)), Monotonic()
    clock = DatabaseClock(FakeStore(local, mono, round_trip=0.01), local=local, monotonic=mono)
    await clock.read()
    assert skew_gauge() == pytest.approx(-90.0)


async def test_the_warning_is_rate_limited_and_absent_under_the_threshold() -> None:
    local, mono = Local(timedelta(seconds=5)), Monotonic()
    clock = DatabaseClock(
        FakeStore(local, mono, round_trip=0.01),
        local=local,
        monotonic=mono,
        warn_above=timedelta(seconds=2),
        warn_every=timedelta(minutes=1),
    )
    with capture_logs() as logs:
        for _ in range(10):
            await clock.read()
            mono.value += 1
        mono.value += 60
        await clock.read()
        local.offset = timedelta(seconds=1)
        mono.value += 120
        await clock.read()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 2
    assert warnings[0]["skew_s"] == pytest.approx(5.0)
    assert warnings[0]["threshold_s"] == 2.0


async def test_between_reads_the_estimate_follows_the_monotonic_clock_not_the_wall() -> None:
    local, mono = Local(timedelta(0)), Monotonic()
    clock = DatabaseClock(FakeStore(local, mono, round_trip=0.2), local=local, monotonic=mono)
    db_now = await clock.read()  # the database's time at the middle of the round trip
    assert clock.now() == db_now + timedelta(seconds=0.1)
    local.offset = timedelta(minutes=5)  # stepped ahead: the estimate does not follow
    mono.value += 1.0
    assert clock.now() == db_now + timedelta(seconds=1.1)
    local.offset = -timedelta(minutes=5)  # and back, past where it was
    mono.value += 1.0
    assert clock.now() == db_now + timedelta(seconds=2.1)


async def test_the_estimate_says_when_it_jumps_and_only_then() -> None:
    # What waits for an instant on the estimate (a worker's held runs) waits on the
    # monotonic clock: it is told when a read finds the estimate off the database's
    # clock, or the local clock jumps; never when only the host's wall clock stepped.
    local, mono = Local(timedelta(0)), Monotonic()
    clock = DatabaseClock(FakeStore(local, mono, round_trip=0.01), local=local, monotonic=mono)
    moved: list[datetime] = []
    clock.on_moved(lambda: moved.append(clock.now()))
    await clock.read()
    await clock.read()
    assert moved == []  # the same clock: nothing moved
    local.offset = timedelta(minutes=5)  # the host's clock stepped: the estimate stays
    await clock.read()
    assert moved == []
    assert clock.skew == timedelta(minutes=5)  # measured, for the gauge and the warning
    local.db += timedelta(seconds=3)  # the database's clock stepped
    await clock.read()
    assert len(moved) == 1
    manual = ManualClock(current=DB_T0)
    tied = DatabaseClock(FakeStore(local, mono, round_trip=0.01), local=manual, monotonic=mono)
    tied.on_moved(lambda: moved.append(tied.now()))
    manual.advance(timedelta(seconds=10))
    manual.current = DB_T0
    assert moved[1:] == [DB_T0 + timedelta(seconds=10), DB_T0]


# -- replicas planning on one clock, simulated ---------------------------------------------

ON_TIME = timedelta(seconds=5)
HORIZON = timedelta(minutes=2)
SKEWS = [timedelta(0), timedelta(minutes=10), -timedelta(minutes=10)]


def job(name: str, every_s: int, catchup: Catchup, window: timedelta) -> Job:
    return Job(
        name=name,
        schedule=IntervalSchedule(timedelta(seconds=every_s)),
        executor=PythonSpec("tests.unit.jobfuncs:sync_job"),
        catchup=catchup,
        catchup_window=window,
    )


JOBS = [
    job(f"{c.value}-{s}s-{int(w.total_seconds())}", s, c, w)
    for c in Catchup
    for s in (1, 2)
    for w in (timedelta(minutes=1), timedelta(hours=1))
]


@dataclass
class Shared:
    """The database: a clock, each job's created time and mark, and the rows."""

    now: datetime
    created: dict[str, datetime] = field(default_factory=dict)
    marks: dict[str, datetime | None] = field(default_factory=dict)
    rows: dict[str, set[datetime]] = field(default_factory=dict)
    missed: int = 0


def simulate(seed: int, on_database_clock: bool) -> Shared:
    """Three replicas (true, +10m, -10m) ticking in a random interleaving for 3 minutes,
    jobs added at random moments, replicas sometimes stalled between read and write."""
    rnd = random.Random(seed)
    db = Shared(now=DB_T0)
    # replica -> (the now it read, the marks it read, when its write can reach the database)
    pending: dict[int, tuple[datetime, dict[str, datetime | None], datetime]] = {}
    to_add = sorted((DB_T0 + timedelta(seconds=rnd.uniform(0, 60)), j) for j in JOBS)
    end = DB_T0 + timedelta(minutes=3)
    while db.now < end:
        db.now += timedelta(seconds=rnd.uniform(0.05, 0.6))
        while to_add and to_add[0][0] <= db.now:
            _, new = to_add.pop(0)
            db.created[new.name], db.marks[new.name], db.rows[new.name] = db.now, None, set()
        replica = rnd.randrange(len(SKEWS))
        if replica not in pending:
            # Read: the clock, then the jobs. Now and then the replica stalls before
            # its write (a pause, a slow network) while the others go on ticking.
            now = db.now if on_database_clock else db.now + SKEWS[replica]
            stall = timedelta(seconds=rnd.uniform(5, 20) if rnd.random() < 0.05 else 0)
            pending[replica] = (now, dict(db.marks), db.now + stall)
            continue
        if db.now < pending[replica][2]:
            continue
        now, marks, _ = pending.pop(replica)
        if on_database_clock and db.now > now + ON_TIME:
            continue  # stale plan: writes nothing (ADVANCE_HIGH_WATER's guard)
        for j in JOBS:
            if j.name not in marks:
                continue
            first_seen = db.created[j.name] if on_database_clock else None
            plan = plan_materialization(
                j,
                marks[j.name],
                now,
                HORIZON,
                first_seen=first_seen,
                on_time=ON_TIME if on_database_clock else timedelta(0),
            )
            db.missed += plan.missed
            db.rows[j.name] |= {r.scheduled_at for r in plan.runs}  # ON CONFLICT DO NOTHING
            mark = db.marks[j.name]
            db.marks[j.name] = (
                plan.materialized_until if mark is None else max(mark, plan.materialized_until)
            )
    return db


def problems(db: Shared) -> list[str]:
    found = []
    for j in JOBS:
        assert isinstance(j.schedule, IntervalSchedule)
        step = int(j.schedule.every.total_seconds())
        mark, born = db.marks[j.name], db.created[j.name]
        assert mark is not None
        first = (int(born.timestamp()) // step + 1) * step
        due = {datetime.fromtimestamp(t, UTC) for t in range(first, int(db.now.timestamp()), step)}
        rows = db.rows[j.name]
        if due - rows:
            found.append(f"{j.name}: {len(due - rows)} due instants never planned")
        if any(t <= born for t in rows):
            found.append(f"{j.name}: rows before the job existed")
        if any(t > db.now + HORIZON for t in rows):
            found.append(f"{j.name}: rows beyond the horizon")
    if db.missed:
        found.append(f"{db.missed} instants dropped as missed")
    return found


@pytest.mark.parametrize("seed", range(20))
def test_replicas_on_the_database_clock_plan_every_instant_once(seed: int) -> None:
    assert problems(simulate(seed, on_database_clock=True)) == []


def test_replicas_on_their_own_clocks_lose_and_invent_instants() -> None:
    """The same simulation with each replica's own clock: what the fix removes."""
    found = problems(simulate(0, on_database_clock=False))
    assert any("never planned" in p for p in found)
    assert any("before the job existed" in p for p in found)
    assert any("dropped as missed" in p for p in found)
