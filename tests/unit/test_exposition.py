"""/metrics as served (exposition.render) against prometheus_client's generate_latest.

The reference is prometheus_client's own exposition of the same registry:
render() must write every family once, and every sample line as
generate_latest writes it, with the per-job families written by their
collectors and left out of the generate_latest pass it makes itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import REGISTRY, generate_latest

from actors.http.server import build_app
from actors.observability import (
    CLUSTER,
    RUN_DURATION,
    RUNS_COMPLETED,
    RUNS_STARTED,
    SCHEDULE_LAG,
    ClusterSnapshot,
    JobSnapshot,
    init_job_series,
    init_series,
)
from actors.observability.exposition import render

NAMES = ["plain", 'q"uote', "back\\slash", "new\nline", "ünï"]
# Samples that move between two readings taken a moment apart.
MOVING = ("process_", "python_", "claimd_cluster_metrics_age_seconds")


def _sample_lines(text: str) -> set[str]:
    return {
        line
        for line in text.splitlines()
        if line
        and not line.startswith("#")
        and not line.startswith(MOVING)
        and "_created" not in line.split(" ")[0]
    }


def test_render_writes_each_family_once_and_each_line_as_generate_latest_does() -> None:
    saved = (CLUSTER.snapshot, CLUSTER.read_at)
    try:
        init_series()
        init_job_series(NAMES)
        RUNS_STARTED.labels("plain").inc(3)
        RUNS_COMPLETED.labels('q"uote', "failed").inc()
        SCHEDULE_LAG.labels("new\nline").observe(0.02)
        RUN_DURATION.labels("back\\slash").observe(2_000_000.0)
        CLUSTER.update(
            ClusterSnapshot(
                jobs=tuple(
                    JobSnapshot(n, i % 2 == 0, 1.7e9 + i, None, i, 0.5 * i, 60.0, 0.0)
                    for i, n in enumerate(NAMES)
                ),
                claimed=2,
                running=1,
            )
        )
        ours = b"".join(render()).decode()
        theirs = generate_latest(REGISTRY).decode()
    finally:
        CLUSTER.snapshot, CLUSTER.read_at = saved
    families = Counter(line.split()[2] for line in ours.splitlines() if line.startswith("# TYPE"))
    assert [name for name, n in families.items() if n > 1] == []
    assert families.keys() == {
        line.split()[2] for line in theirs.splitlines() if line.startswith("# TYPE")
    }
    assert _sample_lines(ours) == _sample_lines(theirs)
    assert 'claimd_runs_started_total{claimd_job="plain"} 3.0' in ours
    assert 'claimd_job_overdue_runs{claimd_job="new\\nline"} 3.0' in ours


async def test_a_head_of_metrics_sends_no_body_and_the_connection_serves_the_next_get() -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async def ready() -> dict[str, object]:
        return {"postgres": "ok"}

    init_job_series(NAMES)
    async with TestServer(build_app(ready)) as server, ClientSession() as session:
        url = str(server.make_url("/metrics"))
        async with session.head(url) as head:
            assert head.status == 200
            assert await head.read() == b""
        # The same keep-alive connection: a body sent after HEAD's headers would
        # be read as this response.
        async with session.get(url) as got:
            assert got.status == 200
            text = await got.text()
    # Streamed a chunk at a time: no length is known before the last chunk.
    assert got.headers.get("Transfer-Encoding") == "chunked"
    assert 'claimd_runs_started_total{claimd_job="plain"}' in text
    assert _sample_lines(text) == _sample_lines(b"".join(render()).decode())


async def test_metrics_sends_the_first_chunk_before_the_rest_of_the_page_is_made() -> None:
    """The page is streamed, never held whole: the scraper holds the first MB
    while the rest is not rendered yet (a writer that waits for the test)."""
    import asyncio
    import threading

    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from actors.observability import exposition

    first_read = threading.Event()
    made_after: list[bool] = []

    class SlowFamily:
        def text(self) -> Iterator[str]:
            yield "# HELP claimd_test_slow A family made in two halves\n"
            yield "# TYPE claimd_test_slow gauge\n"
            yield "".join(f'claimd_test_slow{{i="{i}"}} 1.0\n' for i in range(60_000))
            # The next line is made only once the scraper has the first chunks.
            made_after.append(first_read.wait(timeout=20))
            yield 'claimd_test_slow{i="last"} 2.0\n'

    async def ready() -> dict[str, object]:
        return {"postgres": "ok"}

    writer = SlowFamily()
    exposition.writes_own_text(writer)
    try:
        async with (
            TestServer(build_app(ready)) as server,
            ClientSession() as session,
            session.get(str(server.make_url("/metrics"))) as got,
        ):
            head = await asyncio.wait_for(got.content.read(1 << 16), 15)
            first_read.set()
            rest = await asyncio.wait_for(got.read(), 15)
    finally:
        exposition._WRITERS.remove(writer)
    assert head.startswith(b"# HELP")
    assert made_after == [True]
    assert (head + rest).endswith(b'claimd_test_slow{i="last"} 2.0\n')
