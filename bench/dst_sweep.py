"""claimd's cron against cronsim around every DST transition of every zone, 2027-2030.

Prints how many windows (one zone's transition x one expression) disagree with
cronsim, an evaluator we did not write, under cron(8)'s rule: a schedule with a
wildcard minute or hour (its field starts with ``*``) fires at every real
instant that matches, so its fire times must equal cronsim's; a fixed-time
schedule fires once per local day (gap: shifted to its end, fold: the first
occurrence), so its count per local day must equal cronsim's. Also timed: the
next fire time of a steady-day schedule (the common path), before/after a
change is compared by running this on both trees.

    python -m bench.dst_sweep                 # every zone, 12 expressions per window
    python -m bench.dst_sweep --per-zone 3    # fewer (what the unit test samples)

The comparison itself is ``tests.unit.dst_reference`` (the unit test's).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from actors.domain import CronSchedule, take
from tests.unit.dst_reference import (
    EVERY_ZONE,
    compare_window,
    random_expression,
    transitions_between,
)


def sweep(per_window: int, seed: int) -> tuple[int, int, Counter[str]]:
    rng = random.Random(seed)
    windows = disagreeing = 0
    kinds: Counter[str] = Counter()
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    for name in EVERY_ZONE:
        for at in transitions_between(name, start, end):
            for _ in range(per_window):
                expr = random_expression(rng)
                problem = compare_window(expr, name, at)
                windows += 1
                if problem is not None:
                    disagreeing += 1
                    kinds[problem.split(":")[0]] += 1
    return windows, disagreeing, kinds


def next_fire_micros(rounds: int) -> dict[str, float]:
    """Microseconds per next-fire-time (what next_plan asks) on ordinary days.

    The best of five runs of ``rounds // 5``: the least disturbed by other
    processes on a shared machine.
    """
    out: dict[str, float] = {}
    ordinary = datetime(2026, 6, 10, 7, 13, 5, tzinfo=UTC)
    change_day = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # Berlin's 25-hour day
    for expr, zone, base in (
        ("* * * * *", "UTC", ordinary),
        ("* * * * *", "Europe/Berlin", ordinary),
        ("*/15 * * * *", "America/New_York", ordinary),
        ("30 2 * * *", "Europe/Berlin", ordinary),
        ("0 9 * * 1-5", "Asia/Tokyo", ordinary),
        ("* * * * *", "Europe/Berlin", change_day),
    ):
        schedule = CronSchedule(expr, zone)
        far = timedelta(days=400)
        take(schedule.fire_times(base, base + far), 1)  # warm the memos
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for i in range(rounds // 5):
                after = base + timedelta(minutes=i % 1440)
                take(schedule.fire_times(after, after + far), 1)
            best = min(best, (time.perf_counter() - began) / (rounds // 5) * 1e6)
        out[f"{expr!r} {zone}{' (change day)' if base is change_day else ''}"] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-zone", type=int, default=12, help="expressions per window")
    parser.add_argument("--seed", type=int, default=20270101)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    for label, micros in next_fire_micros(args.rounds).items():
        print(f"next fire time {label:54s} {micros:7.2f} us")
    if args.no_sweep:
        return
    began = time.perf_counter()
    windows, disagreeing, kinds = sweep(args.per_zone, args.seed)
    print(
        f"windows compared: {windows}; disagreeing with cronsim: {disagreeing} "
        f"({dict(kinds)}); {time.perf_counter() - began:.0f} s"
    )


if __name__ == "__main__":
    main()
