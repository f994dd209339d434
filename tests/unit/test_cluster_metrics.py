"""Cluster-wide gauges: the schedule period, one read per interval, a frozen database bounded."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from actors.domain import CronSchedule, IntervalSchedule, Job, PythonSpec
from actors.observability import ClusterCollector
from actors.ports import ClusterReading, JobReading
from actors.replica.cluster_reader import ClusterMetrics, schedule_period

NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)  # a Wednesday


def definition(schedule: CronSchedule | IntervalSchedule) -> str:
    return json.dumps(Job("j", schedule, PythonSpec("m:f")).definition())


def test_the_period_is_the_longest_gap_among_the_next_instants() -> None:
    assert schedule_period(definition(IntervalSchedule(timedelta(seconds=30))), NOW) == 30
    assert schedule_period(definition(CronSchedule("*/5 * * * *", "UTC")), NOW) == 300
    # Weekdays at 02:00: the weekend gap (Friday 02:00 to Monday 02:00) is the period.
    assert (
        schedule_period(definition(CronSchedule("0 2 * * 1-5", "Europe/Berlin")), NOW) == 3 * 86400
    )
    assert schedule_period("{not json", NOW) is None


class Store:
    def __init__(self, reading: ClusterReading, delay: float = 0.0) -> None:
        self.reading = reading
        self.delay = delay
        self.reads = 0

    async def read(self, timeout: float) -> ClusterReading:
        self.reads += 1
        await asyncio.sleep(self.delay)
        return self.reading


def reading(last_success: datetime | None) -> ClusterReading:
    job = JobReading(
        name="beat",
        paused=False,
        fingerprint="f1",
        definition=definition(IntervalSchedule(timedelta(seconds=1))),
        last_success=last_success,
        last_failure=None,
        overdue=2,
        overdue_oldest_age=4.5,
        materialized_behind=0.0,
    )
    return ClusterReading(jobs=(job,), claimed=1, running=3, past_lease=0)


def samples(collector: ClusterCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_one_read_per_interval_and_the_gauges_say_what_was_read() -> None:
    ticks = Ticks()
    collector = ClusterCollector(monotonic=ticks)
    assert samples(collector) == {"claimd_cluster_metrics_age_seconds": float("inf")}
    success = datetime(2026, 3, 4, 11, 59, 30, 123456, tzinfo=UTC)
    store = Store(reading(success))
    metrics = ClusterMetrics(store.read, collector=collector, min_interval=1.0, monotonic=ticks)
    await asyncio.gather(metrics.refresh(), metrics.refresh(), metrics.refresh())
    assert store.reads == 1  # three scrapes at once share one read
    ticks.now += 0.5
    await metrics.refresh()
    assert store.reads == 1
    got = samples(collector)
    assert got["claimd_cluster_metrics_age_seconds"] == 0.5
    assert got["claimd_job_last_success_timestamp_seconds,claimd_job=beat"] == success.timestamp()
    assert "claimd_job_last_failure_timestamp_seconds,claimd_job=beat" not in got
    assert got["claimd_job_overdue_runs,claimd_job=beat"] == 2
    assert got["claimd_overdue_runs"] == 2
    assert got["claimd_overdue_oldest_age_seconds"] == 4.5
    assert got["claimd_runs_in_flight,state=claimed"] == 1
    assert got["claimd_runs_in_flight,state=running"] == 3
    assert got["claimd_job_period_seconds,claimd_job=beat"] == 1
    ticks.now += 1.0
    await metrics.refresh()
    assert store.reads == 2


async def test_a_frozen_database_costs_a_scrape_the_timeout_and_keeps_the_last_figures() -> None:
    ticks = Ticks()
    collector = ClusterCollector(monotonic=ticks)
    store = Store(reading(None))
    metrics = ClusterMetrics(store.read, collector=collector, timeout=0.05, monotonic=ticks)
    await metrics.refresh()
    store.delay = 3600  # never answers
    ticks.now += 5
    await asyncio.wait_for(metrics.refresh(), 5)  # bounded by the 0.05 s timeout
    got = samples(collector)
    assert got["claimd_cluster_metrics_age_seconds"] == 5  # the figures of the last read
    assert got["claimd_overdue_runs"] == 2


async def test_before_the_store_connects_refresh_does_nothing() -> None:
    collector = ClusterCollector()
    await ClusterMetrics(None, collector=collector).refresh()
    assert samples(collector) == {"claimd_cluster_metrics_age_seconds": float("inf")}


async def test_the_per_job_gauges_text_says_what_prometheus_client_writes_for_them() -> None:
    """/metrics takes the per-job gauges from text(); the reference is generate_latest."""
    ticks = Ticks()
    collector = ClusterCollector(monotonic=ticks)
    beat = reading(datetime(2026, 3, 4, 11, 59, 30, tzinfo=UTC)).jobs[0]
    odd = JobReading(
        name='odd "quoted" \\ name\nand a \\n',
        paused=True,
        fingerprint="f2",
        definition="not json",  # no period: that gauge has no sample for it
        last_success=None,
        last_failure=NOW,
        overdue=0,
        overdue_oldest_age=0.0,
        materialized_behind=12.5,
    )
    store = Store(ClusterReading(jobs=(beat, odd), claimed=0, running=0, past_lease=0))
    await ClusterMetrics(store.read, collector=collector, monotonic=ticks).refresh()
    reference = {k: v for k, v in samples(collector).items() if k.startswith("claimd_job_")}
    # beat: no failure yet; odd: no success, no period; and six states each (0 or 1).
    assert len(reference) == 11 + 2 * 6
    states = {k: v for k, v in reference.items() if k.startswith("claimd_job_state") and v}
    assert [k.rsplit("state=", 1)[1] for k in sorted(states)] == ["healthy", "paused"]
    text = "".join(collector.text())
    written = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            written[key] = s.value
    assert written == reference
    # Line for line, HELP and TYPE included, as prometheus_client writes them.
    registry = CollectorRegistry()
    registry.register(collector)
    theirs = generate_latest(registry).decode().splitlines()
    assert set(text.splitlines()) == {line for line in theirs if "claimd_job_" in line}
