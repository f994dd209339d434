"""The migrations' lock declarations: every file reads, and a bad line names its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.adapters.postgres.migrations import LOCK_ORDER, migrations, read_locks


def test_every_migration_reads_with_its_locks_in_the_one_order() -> None:
    found = migrations()
    versions = [m.version for m in found]
    # In order, each once (a branch may hold a number whose predecessor is another's).
    assert versions == sorted(set(versions))
    assert versions[0] == 1
    for migration in found:
        tables = [table for table, _ in migration.locks]
        assert tables == sorted(tables, key=LOCK_ORDER.index)
    by_name = {m.name: m.locks for m in found}
    # Written in the file job_runs first, taken jobs first.
    assert by_name["0002_policies.sql"] == (
        ("jobs", "ACCESS EXCLUSIVE"),
        ("job_runs", "ACCESS EXCLUSIVE"),
    )


def test_a_reversed_declaration_is_taken_in_the_one_order() -> None:
    text = "-- lock: job_runs IN SHARE MODE\n-- lock: jobs IN SHARE MODE\nSELECT 1;\n"
    assert read_locks(Path("0099_x.sql"), text) == (("jobs", "SHARE"), ("job_runs", "SHARE"))


@pytest.mark.parametrize(
    "line",
    [
        "-- lock: job_runs",
        "-- lock: job_runs IN SHARED MODE",
        "-- lock: users IN SHARE MODE",
        "-- lock: job_runs; DROP TABLE jobs IN SHARE MODE",
    ],
)
def test_a_bad_lock_line_is_refused_naming_the_file(line: str) -> None:
    with pytest.raises(ValueError, match=r"^0099_x\.sql: '-- lock: "):
        read_locks(Path("0099_x.sql"), line + "\nSELECT 1;\n")


def test_a_table_locked_twice_is_refused() -> None:
    text = "-- lock: jobs IN SHARE MODE\n-- lock: jobs IN EXCLUSIVE MODE\n"
    with pytest.raises(ValueError, match=r"0099_x\.sql: jobs is locked twice"):
        read_locks(Path("0099_x.sql"), text)
