"""The /metrics text: prometheus_client's for the fixed series, written directly for per-job ones.

With 10,000 jobs the per-job families are ~480,000 samples. Through
prometheus_client's exposition each becomes a ``Sample`` object with a labels
dict before it is formatted: a scrape took 10 s of CPU (past Prometheus's
default scrape timeout) and left the process at 337 MB. The per-job
collectors (``per_job_metrics``, the cluster gauges) therefore write their text
lines themselves, from their plain numbers, in the format prometheus_client
writes (the unit tests parse both and compare them sample for sample);
``collect()`` still yields the same families for anything else that asks
(``REGISTRY.get_sample_value``, a test).

While :func:`render` runs generate_latest over the registry, a thread-local
flag tells those collectors to yield nothing there, so each series is written
once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from itertools import compress, count
from typing import Any, Protocol

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.utils import floatToGoString

_rendering = threading.local()


class WritesText(Protocol):
    def text(self) -> Iterator[str]:
        """The family's exposition: HELP, TYPE, then its sample lines (a piece may hold many)."""
        ...


_WRITERS: list[WritesText] = []
CHUNK = 1 << 20  # characters of text per encoded chunk
BATCH = 4096  # jobs' lines a per-job writer joins into one piece of its text
# Jobs whose lines a per-job writer keeps as one piece between scrapes: a run
# is written again when one of its jobs changed. 8: at 1% of the jobs changed,
# 8% are written again; a string per job cost a string, a tuple and a dict
# entry more (~100 bytes) a job and family (bench/bench_scrape.py).
RUN = 8


def writes_own_text(writer: WritesText) -> None:
    """``writer``'s families are left out of generate_latest and written by :func:`render`."""
    _WRITERS.append(writer)


def rendering() -> bool:
    """True inside :func:`render`'s generate_latest (in its thread): yield nothing there."""
    return bool(getattr(_rendering, "on", False))


def render() -> list[bytes]:
    """The whole /metrics page, as chunks (tests and benches; the server streams them)."""
    return list(render_chunks())


def render_chunks(reuse: bool = True) -> Generator[bytes, None, None]:
    """The /metrics page a chunk (about a MB of text) at a time.

    At 100,000 jobs the page is ~100 MB; the server sends each chunk as it is
    made rather than holding the page (it was 100 MB of a replica's RSS after
    every scrape). Each ``next()`` may run in another thread: the rendering
    flag is set and cleared within the first one. ``reuse=False``: the per-job
    writers that keep their lines between scrapes write them afresh instead
    (their ``fresh_text()``: the bench's baseline, the tests' reference).
    """
    _rendering.on = True
    try:
        fixed = generate_latest(REGISTRY)
    finally:
        _rendering.on = False
    yield fixed
    lines: list[str] = []
    size = 0
    for writer in _WRITERS:
        pieces = writer.text() if reuse else getattr(writer, "fresh_text", writer.text)()
        for line in pieces:
            lines.append(line)
            size += len(line)
            if size >= CHUNK:
                yield "".join(lines).encode()
                lines.clear()
                size = 0
    yield "".join(lines).encode()


def stale_runs(
    now: Sequence[object], then: Sequence[object], differ: Callable[[Any, Any], bool]
) -> set[int]:
    """The runs of RUN items of ``now`` whose text, written from ``then``, does not hold.

    A run holds where each of its items is as it was (``differ`` false, found
    by C loops: 100,000 items in milliseconds); past the shorter of the two,
    every run is written again.
    """
    stale = {i // RUN for i in compress(count(), map(differ, now, then))}
    if len(now) != len(then):
        stale.update(range(min(len(now), len(then)) // RUN, -(-len(now) // RUN)))
    return stale


def help_and_type(name: str, documentation: str, kind: str) -> str:
    escaped = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


def label_text(names: Sequence[str], values: Sequence[str]) -> str:
    """``a="x",b="y"`` in label-name order, values escaped as the text format says."""
    if len(names) == 1:  # the per-job series: the one label, written at scrape for each
        return f'{names[0]}="{escape(values[0])}"'
    pairs = sorted(zip(names, values, strict=True))
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def escape(value: str) -> str:
    """A label value as the text format writes it (backslash, newline, quote escaped)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def number(value: float) -> str:
    return floatToGoString(value)
