"""The text a per-job writer keeps between scrapes is the text it would write afresh.

After random changes between scrapes, each scrape's text (``text()``, reusing
the lines of the runs of jobs that did not change) must equal, byte for byte,
the text written afresh (``fresh_text()``) and the text as the writers wrote
it before they kept anything (the line formulas of that code, copied here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.observability.cluster_gauges import (
    CLUSTER_NOTE,
    JOB_STATE,
    JOB_STATE_HELP,
    JOB_STATES,
    PER_JOB,
    ClusterCollector,
    ClusterSnapshot,
    JobSnapshot,
)
from actors.observability.exposition import RUN, escape, help_and_type, label_text, number
from actors.observability.per_job_metrics import JobCounter, JobHistogram

NAMES = [f"job-{i}" for i in range(40)] + ['q"uote', "back\\slash", "new\nline", "ünï"]
JOB = st.sampled_from(NAMES)
# -0.0 left out: equal to 0.0, a change between the two alone is not seen (see
# ClusterCollector.text); the database never gives it.
FIGURE = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, 60.0, 1.7e9, 1e6, 0.25]),
    st.floats(0.0, 1e10, allow_nan=False).filter(lambda x: x != 0),
)


def _old_counter_text(counter: JobCounter) -> str:
    """JobCounter.text as it was: a line per sample through label_text."""
    name = counter.name + "_total"
    lines = [help_and_type(name, counter.documentation, "counter")]
    for values, value in counter._series():
        lines.append(f"{name}{{{label_text(counter.labelnames, values)}}} {number(value)}\n")
    return "".join(lines)


def _old_cluster_text(snap: ClusterSnapshot) -> str:
    """ClusterCollector.text as it was."""
    lines = []
    for name, text, value in PER_JOB:
        lines.append(help_and_type(name, f"{text}; {CLUSTER_NOTE}", "gauge"))
        for job in snap.jobs:
            if (v := value(job)) is not None:
                lines.append(f'{name}{{claimd_job="{escape(job.name)}"}} {number(v)}\n')
    lines.append(help_and_type(JOB_STATE, f"{JOB_STATE_HELP}; {CLUSTER_NOTE}", "gauge"))
    for job in snap.jobs:
        for state in JOB_STATES:
            lines.append(
                f'{JOB_STATE}{{claimd_job="{escape(job.name)}",state="{state}"}} '
                f"{'1.0' if job.state == state else '0.0'}\n"
            )
    return "".join(lines)


def _text(pieces: Iterator[str]) -> str:
    return "".join(pieces)


# One scrape's changes: (job, column, amount) increments, then a scrape.
INCS = st.lists(
    st.lists(
        st.tuples(JOB, st.integers(0, 2), st.sampled_from([0.0, 1.0, 2.5, 1e6, 3e7])),
        max_size=30,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(INCS)
def test_a_counter_writes_what_it_would_afresh_after_any_changes(
    scrapes: list[list[tuple[str, int, float]]],
) -> None:
    # "actor" sorts before claimd_job: the job's value sits in the middle of the labels.
    counter = JobCounter("claimd_x_total", "Runs", ["claimd_job", "actor", "outcome"])
    rests = [("w", "ok"), ('a"b', "failed"), ("z\\", "timed_out")]
    for job in NAMES[::2]:  # created at zero, as at start
        counter.labels(job, *rests[0])
    for changes in scrapes:
        for job, column, amount in changes:
            counter.labels(job, *rests[column]).inc(amount)
        kept = _text(counter.text())
        assert kept == _text(counter.fresh_text())
        assert kept == _old_counter_text(counter)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(JOB, st.floats(0, 1e7)), max_size=20), max_size=5))
def test_a_histogram_writes_what_it_would_afresh_after_any_observations(
    scrapes: list[list[tuple[str, float]]],
) -> None:
    by_job = JobHistogram("claimd_y_seconds", "Lag", ["claimd_job"], buckets=(0.1, 1, 60))
    every = JobHistogram("claimd_z_seconds", "Lag", ["claimd_job"], buckets=(0.1, 1, 60))
    every.aggregate(True)
    for changes in [[], *scrapes]:
        for job, value in changes:
            by_job.labels(job).observe(value)
            every.labels(job).observe(value)
        for histogram in (by_job, every):
            assert _text(histogram.text()) == _text(histogram.fresh_text())


JOBS = st.lists(
    st.builds(
        JobSnapshot,
        name=JOB,
        paused=st.booleans(),
        last_success=FIGURE,
        last_failure=FIGURE,
        overdue=st.integers(0, 3),
        overdue_oldest_age=st.sampled_from([0.0, 0.5, 12.0]),
        period=FIGURE,
        materialized_behind=st.sampled_from([0.0, 3.0]),
        state=st.sampled_from([*JOB_STATES, "removed"]),
    ),
    max_size=3 * RUN,
    unique_by=lambda j: j.name,
)


@settings(max_examples=150, deadline=None)
@given(JOBS, st.lists(st.lists(st.tuples(st.integers(0, 3 * RUN), JOBS), max_size=3), max_size=5))
def test_the_cluster_gauges_write_what_they_would_afresh_after_any_refresh(
    first: list[JobSnapshot], refreshes: list[list[tuple[int, list[JobSnapshot]]]]
) -> None:
    """Each refresh is a new snapshot of new (mostly equal) objects: some jobs
    replaced by others, some added, some gone."""
    collector = ClusterCollector()
    jobs = list(first)
    for edits in [[], *refreshes]:
        for at, news in edits:
            jobs[at : at + len(news)] = news  # replaced, or added at the end
        seen: set[str] = set()
        unique = []
        for j in jobs:
            if j.name not in seen:
                seen.add(j.name)
                unique.append(j)
        jobs = unique
        # New objects, as ClusterMetrics.refresh makes them.
        snap = ClusterSnapshot(jobs=tuple(_copy(j) for j in jobs))
        collector.update(snap)
        kept = _text(collector.text())
        assert kept == _text(collector.fresh_text())
        assert kept == _old_cluster_text(snap)


def _copy(job: JobSnapshot) -> JobSnapshot:
    """An equal snapshot, a new object."""
    return dataclasses.replace(job)


def test_what_the_cluster_gauges_keep_goes_with_the_jobs() -> None:
    """Bounded by the last snapshot: the lines of jobs no longer reported are let go."""
    collector = ClusterCollector()
    many = tuple(JobSnapshot(f"j{i}", False, None, None, 0, 0.0, 60.0, 0.0) for i in range(100))
    collector.update(ClusterSnapshot(jobs=many))
    _text(collector.text())
    jobs, runs = collector._written
    assert (len(jobs), len(runs)) == (100, -(-100 // RUN))
    collector.update(ClusterSnapshot(jobs=many[:3]))
    assert "j3" not in _text(collector.text())
    jobs, runs = collector._written
    assert [job.name for job in jobs] == ["j0", "j1", "j2"]
    assert len(runs) == 1
    assert "j2" in runs[0][-1]
    assert "j3" not in "".join(runs[0])


def test_a_job_that_ran_is_written_again_and_its_neighbours_are_kept() -> None:
    """What is kept is reused: the other runs' text is the very string of the last scrape."""
    counter = JobCounter("claimd_runs_started_total", "Runs", ["claimd_job"])
    for i in range(4 * RUN):
        counter.labels(f"j{i}")
    _text(counter.text())
    before = counter._written[2]
    counter.labels(f"j{RUN + 1}").inc()
    _text(counter.text())
    after = counter._written[2]
    assert f'claimd_runs_started_total{{claimd_job="j{RUN + 1}"}} 1.0\n' in after[1]
    assert after[1] != before[1]
    assert [a is b for a, b in zip(after, before, strict=True)] == [True, False, True, True]
