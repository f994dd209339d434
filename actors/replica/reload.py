"""SIGHUP: reread the config file and apply its jobs; a file with any error changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from actors.config import ConfigError, ConfigErrors, LoadedConfig, load_config
from actors.domain import Job
from actors.observability import CONFIG_JOB_ERRORS, get_logger, init_job_series, redact
from actors.ports import ReplicaStore

log = get_logger("replica")


class JobsConfig:
    """The replica's config as loaded, and the reload that replaces its jobs.

    Settings are read at start only: a reload that changes them says so and
    applies the jobs alone.
    """

    def __init__(self, path: Path, loaded: LoadedConfig, *, syncs_jobs: bool) -> None:
        self.path = path
        self.loaded = loaded
        self.jobs: dict[str, Job] = dict(loaded.jobs)
        self.syncs_jobs = syncs_jobs  # a scheduler writes the jobs table; a worker only reads
        self._reloading = asyncio.Lock()

    async def reload(self, store: ReplicaStore, replica_id: str) -> bool:
        """Reread the file; a file with any error changes nothing. Recorded as an action."""
        async with self._reloading:  # two SIGHUPs in a row reload one after the other
            ok = await self._reload(store)
        try:  # the record `claimd reload` waits for; a reload never fails for want of it
            await store.record_reload(
                replica_id,
                {"pid": os.getpid(), "path": str(self.path)},
                ok,
                "reloaded" if ok else "refused: the file has errors; jobs unchanged",
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("reload not recorded", error=redact(repr(exc)))
        return ok

    async def _reload(self, store: ReplicaStore) -> bool:
        try:
            loaded = load_config(self.path)
            loaded.raise_for_errors()
        except (ConfigError, ConfigErrors) as exc:
            log.error(
                "reload rejected; running jobs unchanged", path=str(self.path), errors=str(exc)
            )
            return False
        # Materializers plan from the stored definitions, and write only while a
        # plan's definition is still the stored one: a tick racing this sync, here
        # or on another replica, cannot write the old schedule's instants.
        changes = await store.sync_jobs(list(loaded.jobs.values())) if self.syncs_jobs else {}
        if loaded.settings != self.loaded.settings:
            log.warning(
                "reload applies jobs only; changed [claimd] settings take effect "
                "at the next restart",
                path=str(self.path),
            )
        self.jobs = dict(loaded.jobs)
        init_job_series(self.jobs)
        self.loaded = dataclasses.replace(loaded, settings=self.loaded.settings)
        CONFIG_JOB_ERRORS.set(0)
        log.info("reloaded", path=str(self.path), changes=changes)
        return True

    async def sync_at_start(self, store: ReplicaStore) -> None:
        """The jobs as the file says at start; invalid ones are logged and kept as they are."""
        for error in self.loaded.errors:
            log.error(
                "invalid job skipped; the others run",
                path=error.path,
                job=error.job,
                field=error.field_name,
                error=error.message,
            )
        CONFIG_JOB_ERRORS.set(len(self.loaded.errors))
        if self.syncs_jobs:
            changes = await store.sync_jobs(
                list(self.jobs.values()), keep=[e.job for e in self.loaded.errors if e.job]
            )
            log.info("jobs synced", jobs=len(self.jobs), changes=changes)
