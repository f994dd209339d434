"""The config watch: what counts as a changed file (a ConfigMap's symlink swap does, a
touch or a swap to the same bytes does not), and the report it writes each pace."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

from actors.config import load_config
from actors.replica.config_watch import ConfigWatch
from actors.replica.reload import JobsConfig
from actors.testing.memory import InMemoryRunStore, ManualClock

TICK = '[jobs.{name}]\nevery = "1s"\nrun = {{ shell = ["/bin/true"] }}\n'


def swap(folder: Path, version: str) -> None:
    tmp = folder / "..data_tmp"
    tmp.symlink_to(version)
    os.replace(tmp, folder / "..data")


def volume(tmp_path: Path) -> Path:
    """A ConfigMap volume: claimd.toml -> ..data/claimd.toml, ..data -> v1."""
    for version, text in [
        ("v1", TICK.format(name="a")),
        ("v1-copy", TICK.format(name="a")),
        ("v2", TICK.format(name="a") + TICK.format(name="b")),
    ]:
        (tmp_path / version).mkdir()
        (tmp_path / version / "claimd.toml").write_text(text)
    swap(tmp_path, "v1")
    (tmp_path / "claimd.toml").symlink_to("..data/claimd.toml")
    return tmp_path / "claimd.toml"


async def test_only_different_bytes_through_the_path_are_a_change(tmp_path: Path) -> None:
    path = volume(tmp_path)
    config = JobsConfig(path, load_config(path, env={}), syncs_jobs=True)
    reloads: list[int] = []

    async def reload() -> bool:
        reloads.append(1)
        return True

    watch = ConfigWatch(config, "r1", timedelta(seconds=1), reload)
    assert await watch.changed() is False  # the file as loaded
    os.utime(tmp_path / "v1" / "claimd.toml", ns=(1, 1))  # touched: same bytes
    assert await watch.changed() is False
    swap(tmp_path, "v1-copy")  # another folder, the same bytes
    assert await watch.changed() is False
    swap(tmp_path, "v2")  # the ConfigMap updated
    assert await watch.changed() is True


async def test_a_pace_reloads_a_changed_file_and_reports_it(tmp_path: Path) -> None:
    path = volume(tmp_path)
    store = InMemoryRunStore(ManualClock())
    config = JobsConfig(path, load_config(path, env={}), syncs_jobs=True)
    await config.sync_at_start(store, "r1")
    stop = asyncio.Event()
    watch = ConfigWatch(
        config,
        "r1",
        timedelta(seconds=1),
        lambda: config.reload(store, "r1", trigger="file changed"),
    )
    swap(tmp_path, "v2")
    stop.set()  # one pace, then the stop
    await watch.run(store, stop)
    assert set(config.jobs) == {"a", "b"}
    [action] = store.actions
    assert (action["actor"], action["ok"], action["result"]) == (
        "config-watch",
        True,
        "reloaded: jobs 1 added, 0 changed, 0 removed",
    )
    rollout = await store.config_rollout()
    assert [r.file_digest for r in rollout.replicas] == [config.file.digest]
    assert [g.seq for g in rollout.generations] == [2, 1]
