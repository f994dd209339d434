"""The config file watched: a changed file is reloaded as SIGHUP reloads it, and the
replica reports its file's digest to the database (docs/rollout.md).

The file is looked at through its path every ``config_poll``: ``os.stat``
follows symlinks, so a Kubernetes ConfigMap update (the ``..data`` symlink
swapped to a new directory) is a new inode, size or mtime like any edit; the
bytes are then read and compared with those of the last load, so a touch or
a swap to the same content reloads nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

from actors.observability import CONFIG_DIGESTS, get_logger, redact
from actors.pacing import wait_for_stop
from actors.ports import ReplicaStore
from actors.ports.messages import ConfigReport
from actors.replica.reload import JobsConfig, file_bytes_digest

log = get_logger("replica")
REPORT_EVERY_S = 5.0  # the report's pace when the file is not watched (or slower)
REPORT_TTL_MISSES = 3  # a report expires after this many paces without a new one


def file_stamp(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, mtime ns, size) of what the path names now; None: not there now."""
    try:
        st = os.stat(path)  # follows the symlinks: the file a ConfigMap's swap put there
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class ConfigWatch:
    """Every pace: reload a changed file, then report this replica's file to the database."""

    def __init__(
        self,
        config: JobsConfig,
        replica_id: str,
        poll: timedelta,
        reload: Callable[[], Awaitable[bool]],
    ) -> None:
        self.config = config
        self.replica_id = replica_id
        self.watching = poll > timedelta(0)
        self.pace_s = poll.total_seconds() if self.watching else REPORT_EVERY_S
        self.pace_s = min(self.pace_s, REPORT_EVERY_S)
        self._reload = reload
        # None: the first look reads the bytes (a change since the load is not missed).
        self._stamp: tuple[int, int, int, int] | None = None

    async def changed(self) -> bool:
        """Whether the file the path names now differs from the one last loaded."""
        stamp = file_stamp(self.config.path)
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        now = await asyncio.to_thread(file_bytes_digest, self.config.path)
        return now is not None and now != self.config.loaded_bytes

    async def run(self, store: ReplicaStore, stop: asyncio.Event) -> None:
        """Until ``stop``: each pace, the file looked at (a change reloaded), then reported."""
        while True:
            try:
                if self.watching and await self.changed():
                    log.info("config file changed; reloading", path=str(self.config.path))
                    await self._reload()
                await self.report(store)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next pace tries again
                log.warning("config watch failed; trying again", error=redact(repr(exc)))
            if await wait_for_stop(stop, self.pace_s):
                return

    async def report(self, store: ReplicaStore) -> None:
        """This replica's file in the database; the cluster's digests in the gauge."""
        await store.report_config(
            ConfigReport(
                replica=self.replica_id,
                file=self.config.file,
                stale=self.config.stale,
                path=str(self.config.path),
                ttl=timedelta(seconds=self.pace_s * REPORT_TTL_MISSES + 2),
            )
        )
        rollout = await store.config_rollout(generations=1)
        CONFIG_DIGESTS.set(len(rollout.file_digests()))
        if rollout.generations and self.config.in_force != rollout.generations[0]:
            self.config.in_force = rollout.generations[0]
            self.config.show()
