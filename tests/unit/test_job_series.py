"""The compact per-job series expose what prometheus_client's own metrics expose.

The reference is prometheus_client itself: the same observations go into a
real Counter / Histogram and into ours, each in a registry of its own, and the
two text expositions must agree sample for sample (prometheus_client's
``_created`` samples aside: ours have none).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from actors.observability.per_job_metrics import JobCounter, JobHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
JOBS = st.sampled_from(
    ["backup", "nightly-export", 'odd "quoted" name', "ünïcode", "ends\\", "new\nline", "lit\\n"]
)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _text_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of /metrics text as claimd writes it (exposition.render's per-job part)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _lines(text: str) -> set[str]:
    """The sample lines, as written (prometheus_client's ``_created`` ones aside)."""
    return {
        line
        for line in text.splitlines()
        if line and not line.startswith("#") and "_created" not in line.split(" ")[0]
    }


def _help_and_types_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("# HELP", "# TYPE"))]


def _help_and_types(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith(("# HELP", "# TYPE")) and "_created" not in line
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(JOBS, st.sampled_from(["succeeded", "failed"]), st.integers(0, 5))))
def test_a_counter_exposes_what_prometheus_client_does(
    incs: list[tuple[str, str, int]],
) -> None:
    theirs_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    theirs = Counter(
        "claimd_x_total", "Runs, by job", ["claimd_job", "outcome"], registry=theirs_registry
    )
    ours = JobCounter("claimd_x_total", "Runs, by job", ["claimd_job", "outcome"])
    ours_registry.register(ours)
    for job, outcome, n in incs:
        theirs.labels(job, outcome).inc(n)
        ours.labels(job, outcome).inc(n)
    assert _samples(ours_registry) == _samples(theirs_registry)
    assert _help_and_types(ours_registry) == _help_and_types(theirs_registry)
    # The text /metrics serves, written by the collector itself, says the same.
    text = "".join(ours.text())
    assert _text_samples(text) == _samples(theirs_registry)
    assert _help_and_types_of(text) == _help_and_types(theirs_registry)
    assert _lines(text) == _lines(generate_latest(theirs_registry).decode())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            JOBS,
            st.one_of(
                st.sampled_from(BUCKETS),  # exactly on a bound: le is inclusive
                st.floats(0, 120, allow_nan=False),
            ),
        )
    )
)
def test_a_histogram_exposes_what_prometheus_client_does(
    observations: list[tuple[str, float]],
) -> None:
    theirs_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    theirs = Histogram(
        "claimd_y_seconds", "Lag", ["claimd_job"], buckets=BUCKETS, registry=theirs_registry
    )
    ours = JobHistogram("claimd_y_seconds", "Lag", ["claimd_job"], buckets=BUCKETS)
    ours_registry.register(ours)
    for job, value in observations:
        theirs.labels(job).observe(value)
        ours.labels(job).observe(value)
    theirs_samples, ours_samples = _samples(theirs_registry), _samples(ours_registry)
    assert ours_samples.keys() == theirs_samples.keys()
    for key, value in theirs_samples.items():
        # Sums are added in the same order, so they agree to the last bit.
        assert ours_samples[key] == value, key
    assert _help_and_types(ours_registry) == _help_and_types(theirs_registry)
    text = "".join(ours.text())
    assert _text_samples(text) == theirs_samples
    assert _help_and_types_of(text) == _help_and_types(theirs_registry)
    assert _lines(text) == _lines(generate_latest(theirs_registry).decode())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(JOBS, st.floats(0, 120, allow_nan=False))))
def test_an_aggregated_histogram_exposes_what_an_unlabelled_prometheus_histogram_does(
    observations: list[tuple[str, float]],
) -> None:
    """job_histograms = false: every job's observations in one series, no claimd_job label."""
    theirs_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    theirs = Histogram("claimd_y_seconds", "Lag", buckets=BUCKETS, registry=theirs_registry)
    ours = JobHistogram("claimd_y_seconds", "Lag", ["claimd_job"], buckets=BUCKETS)
    ours.aggregate(True)
    ours_registry.register(ours)
    for job, value in observations:
        theirs.observe(value)
        ours.labels(job).observe(value)
    assert _samples(ours_registry) == _samples(theirs_registry)
    assert _help_and_types(ours_registry) == _help_and_types(theirs_registry)
    assert _lines("".join(ours.text())) == _lines(generate_latest(theirs_registry).decode())
    # Back to per job: one series per job again, the aggregate gone.
    ours.aggregate(False)
    ours.labels("backup").observe(1.0)
    labels = {dict(k[1]).get("claimd_job") for k in _samples(ours_registry)}
    assert labels == {"backup"}


def test_series_created_at_zero_are_exposed_before_anything_happens() -> None:
    registry = CollectorRegistry()
    counter = JobCounter("claimd_z_total", "Z", ["claimd_job"])
    histogram = JobHistogram("claimd_w_seconds", "W", ["claimd_job"], buckets=(1, 2))
    registry.register(counter)
    registry.register(histogram)
    counter.labels("backup")
    histogram.labels("backup")
    assert registry.get_sample_value("claimd_z_total", {"claimd_job": "backup"}) == 0
    assert registry.get_sample_value("claimd_w_seconds_count", {"claimd_job": "backup"}) == 0
    assert (
        registry.get_sample_value("claimd_w_seconds_bucket", {"claimd_job": "backup", "le": "+Inf"})
        == 0
    )


def test_wrong_label_counts_and_negative_increments_are_refused() -> None:
    counter = JobCounter("claimd_v_total", "V", ["claimd_job", "outcome"])
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels("only-one")
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("a", "b").inc(-1)


def test_jobs_nothing_was_counted_for_share_one_row_and_a_count_moves_one_series() -> None:
    counter = JobCounter("claimd_u_total", "U", ["claimd_job", "outcome"])
    registry = CollectorRegistry()
    registry.register(counter)
    for i in range(1_000):
        for outcome in ("succeeded", "failed", "timed_out"):
            counter.labels(f"job-{i}", outcome)
    assert len({id(row) for row in counter._rows.values()}) == 1
    counter.labels("job-7", "failed").inc(2)
    counted = {
        (dict(labels)["claimd_job"], dict(labels)["outcome"]): value
        for (_, labels), value in _samples(registry).items()
        if value
    }
    assert counted == {("job-7", "failed"): 2.0}
    assert (
        registry.get_sample_value("claimd_u_total", {"claimd_job": "job-7", "outcome": "succeeded"})
        == 0
    )
    assert counter.labels("job-7", "failed").value == 2.0
    # The others still share their row; a series not created is absent.
    assert len({id(row) for row in counter._rows.values()}) == 2
    counter.labels("only-once", "failed")
    assert (
        registry.get_sample_value(
            "claimd_u_total", {"claimd_job": "only-once", "outcome": "succeeded"}
        )
        is None
    )
