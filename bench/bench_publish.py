"""Publish: ``JetStreamBroker.publish_many`` against awaiting one ``js.publish`` at a time.

Publishes ``--messages`` dispatch messages to a stream of the benchmark's own:
with ``publish_many`` in batches of ``--batch`` (500 is the shipped
``claim_batch``, the size of the batches the dispatcher hands it; all
publishes of a batch in flight, acks awaited together), and, as the naive
baseline, with one ``js.publish`` awaited before the next (same subject,
body and ``Nats-Msg-Id`` header). The baseline stops after
``--baseline-seconds``.

Afterwards the stream's message count must equal the acked publishes (the
message ids are unique, so deduplication must drop nothing).

    python -m bench.bench_publish [--messages 20000 --batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
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


async def main(args: argparse.Namespace) -> None:
    async with bench_stream() as broker:
        print(await environment(broker=broker))
        deployment = broker.stream.removeprefix("CLAIMD_")
        print(
            f"{args.messages} messages; publish_many batches of {args.batch} vs one "
            f"publish at a time (budget {args.baseline_seconds}s)"
        )
        # A few publishes first so connection set-up is in neither figure.
        await broker.publish_many(messages(10, deployment))
        before = await stream_count(broker)
        b_acked, b_failed, b_seconds = await batched(
            broker, messages(args.messages, deployment), args.batch, args.max_seconds
        )
        after_batched = await stream_count(broker)
        s_acked, s_failed, s_seconds = await one_at_a_time(
            broker, messages(args.messages, deployment), args.baseline_seconds
        )
        after_serial = await stream_count(broker)
    print(
        f"  publish_many:    {b_acked:>6} acked, {b_failed} failed in {b_seconds:5.2f}s; "
        f"stream grew by {after_batched - before}"
    )
    print(
        f"  one at a time:   {s_acked:>6} acked, {s_failed} failed in {s_seconds:5.2f}s; "
        f"stream grew by {after_serial - after_batched}"
    )
    rows = [
        Row(
            f"publish_many (batch {args.batch}) vs serial publish",
            b_acked / b_seconds,
            s_acked / s_seconds,
            "msgs/s",
        )
    ]
    lost = (b_acked - (after_batched - before)) + (s_acked - (after_serial - after_batched))
    print_table(
        "JetStream publish",
        rows,
        [
            "figure = publish_many, baseline = await js.publish one message at a time",
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
