"""Per-job series kept in plain numbers, exposed by one collector at scrape time.

prometheus_client gives every labelled series an object of its own (a lock, a
value object, the names and labels again): about 650 bytes a counter and
4-5 KB a histogram. claimd creates every per-job series at start (an absent
series cannot be alerted on), so 10,000 jobs cost 150 MB of such objects
before a run started. Here a job's counters of one family are one row of
floats (rows at zero shared) and a histogram one list of bucket counts and its
sum; the exposition (names, HELP, labels,
buckets) is the one prometheus_client writes for the same metric, without the
``_created`` samples, and the unit tests check it against prometheus_client's
own output.

Counters and histograms are only changed from the event loop (the worker,
reaper and materializer), so there is no lock. ``/metrics`` renders in a
thread: a collection copies the series dict in one step (atomic under the
GIL) and reads each number once; a scrape taken while a run is being
recorded may see a histogram's count one ahead of its sum, as any scrape
taken a moment earlier or later could.

A scrape writes again only what changed since the last one. Writing every
line took 2.5 s of CPU at 100,000 jobs (a thread holding the GIL against
the event loop, at a herd's instant too), though most jobs had run nothing
since. A counter keeps the lines of each run of RUN jobs with the rows they
were written from (a row is replaced, never changed: the same rows are the
same text); a histogram series its lines with the count of observations it
had. What is kept is about these families' part of the page (measured by
bench/bench_scrape.py) and holds only the jobs that have a row or series.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from operator import is_not, itemgetter, ne

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from actors.observability.exposition import (
    BATCH,
    RUN,
    escape,
    help_and_type,
    label_text,
    number,
    rendering,
    stale_runs,
)


class _CounterChild:
    """One series of a JobCounter: ``.inc()`` adds to its place in the job's row."""

    __slots__ = ("_column", "_family", "_job")

    def __init__(self, family: JobCounter, job: str, column: int) -> None:
        self._family, self._job, self._column = family, job, column

    @property
    def value(self) -> float:
        return self._family._rows[self._job][self._column] or 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self._family._add(self._job, self._column, amount)


class _HistogramChild:
    __slots__ = ("counts", "observed", "sum", "upper", "written")

    def __init__(self, upper: tuple[float, ...]) -> None:
        self.upper = upper
        self.counts = [0] * (len(upper) + 1)  # the last is +Inf
        self.sum = 0.0
        self.observed = 0  # observations: the text in ``written`` is the series' at this count
        self.written: tuple[int, str] | None = None  # (observed, text), set by a scrape

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose bound is >= amount (le is inclusive).
        self.counts[bisect.bisect_left(self.upper, amount)] += 1
        # Last: a scrape reads ``observed`` before the counts, so text written
        # mid-observation is kept under the count before it and written again.
        self.observed += 1


# A job's row: its series' values in the order of the family's columns; None:
# that series was not created for the job.
_Row = tuple[float | None, ...]


class JobCounter(Collector):
    """A counter family by label values, ``.labels(*values).inc()`` as prometheus_client's.

    The first label is the job. Each job has one row, a tuple of its series'
    values by column (a column per value of the other labels: an outcome, say);
    the rows still at zero are one shared tuple per pattern. 100,000 jobs then
    cost a dict entry each until something is counted, where an object per
    series and its label tuple were ~130 bytes a series (9 series a job).
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._columns: dict[tuple[str, ...], int] = {}  # the other labels' values -> column
        self._rows: dict[str, _Row] = {}
        self._zero_rows: dict[_Row, _Row] = {}  # the rows nothing was counted in, shared
        # As the last scrape wrote them: the jobs, their rows, the lines of each run of RUN jobs.
        self._written: tuple[tuple[str, ...], tuple[_Row, ...], list[str]] = ((), (), [])

    def labels(self, *values: str) -> _CounterChild:
        if len(values) != len(self.labelnames) or not values:
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        job, rest = str(values[0]), tuple(str(v) for v in values[1:])
        column = self._columns.get(rest)
        if column is None:
            column = self._columns[rest] = len(self._columns)
        row = self._rows.get(job, ())
        if column >= len(row) or row[column] is None:
            grown = list(row) + [None] * (column + 1 - len(row))
            grown[column] = 0.0
            self._store(job, tuple(grown))
        return _CounterChild(self, job, column)

    def _add(self, job: str, column: int, amount: float) -> None:
        row = self._rows[job]
        self._store(job, (*row[:column], (row[column] or 0.0) + amount, *row[column + 1 :]))

    def _store(self, job: str, row: _Row) -> None:
        # One assignment of an immutable row: a scrape in its thread reads the
        # row before or after, never half of it.
        if not any(row):
            row = self._zero_rows.setdefault(row, row)
        self._rows[job] = row

    def _series(self) -> Iterator[tuple[tuple[str, ...], float]]:
        columns = list(self._columns.items())
        for job, row in list(self._rows.items()):
            for rest, column in columns:
                if column < len(row) and (value := row[column]) is not None:
                    yield (job, *rest), value

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        if rendering():
            return  # /metrics: written by text()
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, value in self._series():
            family.add_metric(values, value)
        yield family

    def text(self) -> Iterator[str]:
        """The family's text; a run of jobs' lines written again only if one of its rows changed."""
        return self._text(reuse=True)

    def fresh_text(self) -> Iterator[str]:
        """The same text, every line written afresh (the reference for the text kept)."""
        return self._text(reuse=False)

    def _text(self, reuse: bool) -> Iterator[str]:
        name = self.name + "_total"
        yield help_and_type(name, self.documentation, "counter")
        # The rows before the columns: a row's columns were added before it was
        # stored, so every column a row read here has is in the list below.
        items = list(self._rows.items())
        columns = [self._column_text(name, rest) for rest in list(self._columns)]
        jobs: tuple[str, ...] = tuple(map(itemgetter(0), items))
        rows: tuple[_Row, ...] = tuple(map(itemgetter(1), items))
        then_jobs, then_rows, then = self._written if reuse else ((), (), [])
        # A run is written again if a job moved or a row was replaced (the same
        # row object is the same numbers: rows are immutable).
        stale = stale_runs(jobs, then_jobs, ne) | stale_runs(rows, then_rows, is_not)
        texts: list[str] = []
        for n, start in enumerate(range(0, len(jobs), RUN)):
            if n in stale:
                end = start + RUN
                pairs = zip(jobs[start:end], rows[start:end], strict=True)
                texts.append("".join(self._row_text(job, row, columns) for job, row in pairs))
            else:
                texts.append(then[n])
        if reuse:
            self._written = (jobs, rows, texts)
        for start in range(0, len(texts), BATCH // RUN):
            yield "".join(texts[start : start + BATCH // RUN])

    def _column_text(self, name: str, rest: tuple[str, ...]) -> tuple[str, str]:
        """A column's line around its job's label value: ``a{claimd_job="`` and ``",b="x"} ``.

        As ``label_text`` orders and escapes them; written once a scrape, not per line.
        """
        pairs = sorted(zip(self.labelnames, (None, *rest), strict=True), key=itemgetter(0))
        job_at = next(i for i, (_, value) in enumerate(pairs) if value is None)
        before = "".join(f'{k}="{escape(v)}",' for k, v in pairs[:job_at] if v is not None)
        after = "".join(f',{k}="{escape(v)}"' for k, v in pairs[job_at + 1 :] if v is not None)
        return f'{name}{{{before}{pairs[job_at][0]}="', f'"{after}}} '

    @staticmethod
    def _row_text(job: str, row: _Row, columns: list[tuple[str, str]]) -> str:
        label = escape(job)
        # A counter is never -0.0 (increments are >= 0 and start from 0.0): 0 is "0.0".
        return "".join(
            f"{before}{label}{after}{'0.0' if value == 0 else number(value)}\n"
            for (before, after), value in zip(columns, row, strict=False)
            if value is not None
        )


class JobHistogram(Collector):
    """A histogram family by label values, ``.labels(*values).observe(x)``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        upper = tuple(float(b) for b in buckets if not math.isinf(b))
        if list(upper) != sorted(set(upper)):
            raise ValueError(f"{name}: buckets must be increasing")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.upper = upper
        self._le = [floatToGoString(b) for b in upper] + ["+Inf"]
        self._children: dict[tuple[str, ...], _HistogramChild] = {}
        self._all: _HistogramChild | None = None  # set by aggregate(): one series for all

    def aggregate(self, on: bool) -> None:
        """One series for every label value (no labels), or one per value (the default).

        A histogram is ~20 series per label value: with 10,000 jobs, two of them
        are most of ``/metrics``. Switching drops what was observed so far (a
        counter reset, to Prometheus); claimd switches only at start.
        """
        self._children = {}
        self._all = _HistogramChild(self.upper) if on else None

    def _labels(self) -> tuple[str, ...]:
        return () if self._all is not None else self.labelnames

    def labels(self, *values: str) -> _HistogramChild:
        if self._all is not None:
            return self._all
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[tuple(str(v) for v in values)] = _HistogramChild(self.upper)
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self._labels())

    def collect(self) -> Iterator[Metric]:
        if rendering():
            return  # /metrics: written by text()
        family = HistogramMetricFamily(self.name, self.documentation, labels=self._labels())
        if self._all is not None:
            self._add(family, (), self._all)
            yield family
            return
        for values, child in list(self._children.items()):
            self._add(family, values, child)
        yield family

    def _add(
        self, family: HistogramMetricFamily, values: tuple[str, ...], child: _HistogramChild
    ) -> None:
        cumulative, running = [], 0
        for le, count in zip(self._le, child.counts, strict=True):
            running += count
            cumulative.append((le, float(running)))
        family.add_metric(list(values), cumulative, child.sum)

    def text(self) -> Iterator[str]:
        """The family's text; a series' lines written again only once it observed more."""
        return self._text(reuse=True)

    def fresh_text(self) -> Iterator[str]:
        """The same text, every line written afresh (the reference for the text kept)."""
        return self._text(reuse=False)

    def _text(self, reuse: bool) -> Iterator[str]:
        yield help_and_type(self.name, self.documentation, "histogram")
        every = self._all
        if every is not None:
            yield self._kept_text((), every, reuse)
            return
        pieces: list[str] = []
        for values, child in list(self._children.items()):
            pieces.append(self._kept_text(values, child, reuse))
            if len(pieces) == BATCH:
                yield "".join(pieces)
                pieces.clear()
        yield "".join(pieces)

    def _kept_text(self, values: tuple[str, ...], child: _HistogramChild, reuse: bool) -> str:
        observed, written = child.observed, child.written  # before the counts are read
        if reuse and written is not None and written[0] == observed:
            return written[1]
        text = self._series_text(label_text(self.labelnames, values) if values else "", child)
        if reuse:
            child.written = (observed, text)
        return text

    def _series_text(self, labels: str, child: _HistogramChild) -> str:
        """One series' lines as one string (the page is written a piece at a time)."""
        name, sep = self.name, "," if labels else ""
        counts, total = list(child.counts), child.sum  # one reading of a series
        lines, running = [], 0
        for le, count in zip(self._le, counts, strict=True):
            running += count
            lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {_count(running)}\n')
        braces = f"{{{labels}}}" if labels else ""
        lines.append(
            f"{name}_count{braces} {_count(running)}\n{name}_sum{braces} {number(total)}\n"
        )
        return "".join(lines)


def _count(n: int) -> str:
    """``n`` as prometheus_client writes a float count (Go's form: 1.234567e+06 from 1e6)."""
    return f"{n}.0" if n < 1_000_000 else number(float(n))
