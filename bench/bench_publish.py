"""Publish: ``JetStreamBroker.publish_many`` against gathered and serial ``js.publish``.

Publishes ``--messages`` dispatch messages to a stream of the benchmark's own:
with ``publish_many`` in batches of ``--batch`` (500 is the shipped
``claim_batch``, the size of the batches the dispatcher hands it; the batch
pipelined under one reply inbox, acks collected together); with the
previous ``publish_many``, one ``js.publish`` request per message, all of a
batch gathered at once (its own inbox, future, timer and task each); and, as
the naive baseline, with one ``js.publish`` awaited before the next (same
subject, body and ``Nats-Msg-Id`` header). The serial baseline stops after
``--baseline-seconds``. CPU is this process's (the client's) per 1000 acked
messages; the server runs on the same host.

Afterwards the stream's message count must equal the acked publishes (the
message ids are unique, so deduplication must drop nothing).

    python -m bench.bench_publish [--messages 20000 --batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.adapters.nats import JetStreamBroker, encode
from actors.ports import DispatchMessage
from bench.common import Row, bench_stream, environment, print_table


def messages(n: int, deployment: str) -> list[DispatchMessage]:
    base = datetime.now(UTC).replace(microsecond=0)
    return [
        DispatchMessage(
            run_id=str(uuid.uuid4()),
            epoch=1,
            job=f"job-{i % 100:05d}",
            scheduled_at=base + timedelta(seconds=i),
            attempt=1,
            deployment=deployment,
        )
        for i in range(n)
    ]


async def stream_count(broker: JetStreamBroker) -> int:
    return int((await broker.js.stream_info(broker.stream)).state.messages)


async def batched(
    broker: JetStreamBroker, msgs: list[DispatchMessage], batch: int, budget: float
) -> tuple[int, int, float]:
    """(acked, failed, seconds) publishing with publish_many, one batch after another."""
    acked = failed = 0
    start = time.perf_counter()
    for i in range(0, len(msgs), batch):
        if time.perf_counter() - start >= budget:
            break
        results = await broker.publish_many(msgs[i : i + batch])
        failed += sum(1 for r in results if r is not None)
        acked += sum(1 for r in results if r is None)
    return acked, failed, time.perf_counter() - start


async def gathered(
    broker: JetStreamBroker, msgs: list[DispatchMessage], batch: int, budget: float
) -> tuple[int, int, float]:
    """(acked, failed, seconds) with one js.publish request per message, a batch gathered."""

    async def one(m: DispatchMessage) -> None:
        await broker.js.publish(
            broker.subject,
            encode(m),
            timeout=broker.publish_timeout,
            stream=broker.stream,
            headers={"Nats-Msg-Id": m.msg_id},
        )

    acked = failed = 0
    start = time.perf_counter()
    for i in range(0, len(msgs), batch):
        if time.perf_counter() - start >= budget:
            break
        results = await asyncio.gather(
            *(one(m) for m in msgs[i : i + batch]), return_exceptions=True
        )
        failed += sum(1 for r in results if r is not None)
        acked += sum(1 for r in results if r is None)
    return acked, failed, time.perf_counter() - start


async def one_at_a_time(
    broker: JetStreamBroker, msgs: list[DispatchMessage], budget: float
) -> tuple[int, int, float]:
    """(acked, failed, seconds) awaiting each publish's ack before the next."""
    acked = failed = 0
    start = time.perf_counter()
    for m in msgs:
        if time.perf_counter() - start >= budget:
            break
        try:
            await broker.js.publish(
                broker.subject,
                encode(m),
                timeout=broker.publish_timeout,
                stream=broker.stream,
                headers={"Nats-Msg-Id": m.msg_id},
            )
            acked += 1
        except Exception:  # noqa: BLE001 - counted, as publish_many counts them
            failed += 1
    return acked, failed, time.perf_counter() - start


async def _timed(
    run: Callable[[], Awaitable[tuple[int, int, float]]],
) -> tuple[int, int, float, float]:
    """(acked, failed, seconds, CPU seconds of this process)."""
    cpu = time.process_time()
    acked, failed, seconds = await run()
    return acked, failed, seconds, time.process_time() - cpu


async def main(args: argparse.Namespace) -> None:
    async with bench_stream() as broker:
        print(await environment(broker=broker))
        deployment = broker.stream.removeprefix("CLAIMD_")
        print(
            f"{args.messages} messages; publish_many batches of {args.batch} vs the "
            f"previous publish_many (gathered js.publish) and one publish at a time "
            f"(budget {args.baseline_seconds}s); load {os.getloadavg()[0]:.2f}"
        )
        # A few publishes first so connection set-up is in no figure.
        await broker.publish_many(messages(10, deployment))
        results: dict[str, tuple[int, int, float, float]] = {}
        grew: dict[str, int] = {}
        variants: dict[str, Callable[[], Awaitable[tuple[int, int, float]]]] = {
            "publish_many": lambda: batched(
                broker, messages(args.messages, deployment), args.batch, args.max_seconds
            ),
            "gathered js.publish": lambda: gathered(
                broker, messages(args.messages, deployment), args.batch, args.max_seconds
            ),
            "one at a time": lambda: one_at_a_time(
                broker, messages(args.messages, deployment), args.baseline_seconds
            ),
        }
        for name, run in variants.items():
            before = await stream_count(broker)
            results[name] = await _timed(run)
            grew[name] = await stream_count(broker) - before
    for name, (acked, failed, seconds, _) in results.items():
        print(
            f"  {name + ':':<21} {acked:>6} acked, {failed} failed in {seconds:5.2f}s; "
            f"stream grew by {grew[name]}"
        )

    def rate(name: str) -> float:
        return results[name][0] / results[name][2]

    def cpu_per_1000(name: str) -> float:
        return 1e6 * results[name][3] / max(1, results[name][0])

    figure = f"publish_many (batch {args.batch})"
    rows = [
        Row(
            f"{figure} vs gathered js.publish",
            rate("publish_many"),
            rate("gathered js.publish"),
            "msgs/s",
        ),
        Row(f"{figure} vs serial publish", rate("publish_many"), rate("one at a time"), "msgs/s"),
        Row(
            "client CPU vs gathered js.publish",
            cpu_per_1000("publish_many"),
            cpu_per_1000("gathered js.publish"),
            "ms/1000 msgs",
            higher_is_better=False,
        ),
        Row(
            "client CPU vs serial publish",
            cpu_per_1000("publish_many"),
            cpu_per_1000("one at a time"),
            "ms/1000 msgs",
            higher_is_better=False,
        ),
    ]
    lost = sum(results[name][0] - grew[name] for name in results)
    print_table(
        "JetStream publish",
        rows,
        [
            "figure = publish_many (pipelined, one inbox); baselines = the previous "
            "publish_many (one js.publish request per message, gathered) and await "
            "js.publish one message at a time",
            f"acked publishes missing from the stream: {lost}",
        ],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--baseline-seconds", type=float, default=6.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
