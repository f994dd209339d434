"""Per-job series kept in plain numbers, exposed by one collector at scrape time.

prometheus_client gives every labelled series an object of its own (a lock, a
value object, the names and labels again): about 650 bytes a counter and
4-5 KB a histogram. claimd creates every per-job series at start (an absent
series cannot be alerted on), so 10,000 jobs cost 150 MB of such objects
before a run started. Here a counter series is one float and a histogram one
list of bucket counts and its sum; the exposition (names, HELP, labels,
buckets) is the one prometheus_client writes for the same metric, without the
``_created`` samples, and the unit tests check it against prometheus_client's
own output.

Counters and histograms are only changed from the event loop (the worker,
reaper and materializer), so there is no lock. ``/metrics`` renders in a
thread: a collection copies the series dict in one step (atomic under the
GIL) and reads each number once; a scrape taken while a run is being
recorded may see a histogram's count one ahead of its sum, as any scrape
taken a moment earlier or later could.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from actors.observability.exposition import help_and_type, label_text, number, rendering


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class _HistogramChild:
    __slots__ = ("counts", "sum", "upper")

    def __init__(self, upper: tuple[float, ...]) -> None:
        self.upper = upper
        self.counts = [0] * (len(upper) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose bound is >= amount (le is inclusive).
        self.counts[bisect.bisect_left(self.upper, amount)] += 1


class JobCounter(Collector):
    """A counter family by label values, ``.labels(*values).inc()`` as prometheus_client's."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _CounterChild] = {}

    def labels(self, *values: str) -> _CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[tuple(str(v) for v in values)] = _CounterChild()
        return child

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        if rendering():
            return  # /metrics: written by text()
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(values, child.value)
        yield family

    def text(self) -> Iterator[str]:
        name = self.name + "_total"
        yield help_and_type(name, self.documentation, "counter")
        names = self.labelnames
        for values, child in list(self._children.items()):
            yield f"{name}{{{label_text(names, values)}}} {number(child.value)}\n"


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
        name = self.name
        yield help_and_type(name, self.documentation, "histogram")
        if self._all is not None:
            yield from self._series_text("", self._all)
            return
        names = self.labelnames
        for values, child in list(self._children.items()):
            yield from self._series_text(label_text(names, values), child)

    def _series_text(self, labels: str, child: _HistogramChild) -> Iterator[str]:
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
        yield "".join(lines)


def _count(n: int) -> str:
    """``n`` as prometheus_client writes a float count (Go's form: 1.234567e+06 from 1e6)."""
    return f"{n}.0" if n < 1_000_000 else number(float(n))
