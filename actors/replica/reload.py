"""SIGHUP: reread the config file and apply its jobs; a file with any error changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

from actors.config import (
    CodeImport,
    ConfigError,
    ConfigErrors,
    LoadedConfig,
    Settings,
    load_config,
)
from actors.domain import Job
from actors.observability import (
    CONFIG_JOB_ERRORS,
    CONFIG_JOB_REJECTED,
    get_logger,
    init_job_series,
    redact,
)
from actors.observability.memory import trim_heap
from actors.ports import RejectedJob, ReplicaStore

log = get_logger("replica")
CHANGE_KINDS = ("added", "changed", "removed")
# The verdict is stored with the reload's record (operator_actions.arguments,
# a few kB): long lists are cut, their counts kept.
LISTED = 20
ERROR_CHARS = 300


def _names(names: list[str]) -> dict[str, Any]:
    return {"count": len(names), "names": sorted(names)[:LISTED]}


def _refused(errors: list[ConfigError]) -> dict[str, Any]:
    """A refusal's verdict: every error (the first LISTED), the jobs they reject."""
    rejected = sorted({e.job for e in errors if e.job is not None})
    listed = [str(e)[:ERROR_CHARS] for e in errors[:LISTED]]
    return {"errors": {"count": len(errors), "messages": listed}, "rejected": _names(rejected)}


def _changed_settings(old: Settings, new: Settings) -> list[str]:
    """The [claimd] settings whose value the file changed (applied at the next restart).

    ``modules`` is not one: it names where jobs are declared, applied with the jobs.
    """
    return [
        name
        for name in type(old).model_fields
        if name != "modules" and getattr(old, name) != getattr(new, name)
    ]


class JobsConfig:
    """The replica's config as loaded, and the reload that replaces its jobs.

    Settings are read at start only: a reload that changes them says so and
    applies the jobs alone.
    """

    def __init__(
        self,
        path: Path,
        loaded: LoadedConfig,
        *,
        syncs_jobs: bool,
        env: dict[str, str] | None = None,
    ) -> None:
        self.path = path
        self.loaded = loaded
        # Reread with the environment it was first read with: `claimd dev` names
        # its embedded servers there, and without them every reload would find
        # "changed" settings that no one changed.
        self._env = env
        self.jobs: dict[str, Job] = dict(loaded.jobs)
        self.syncs_jobs = syncs_jobs  # a scheduler writes the jobs table; a worker only reads
        self._reloading = asyncio.Lock()

    async def reload(self, store: ReplicaStore, replica_id: str) -> bool:
        """Reread the file; a file with any error changes nothing. Recorded as an action.

        The record says what changed (jobs added, changed, removed) or, refused,
        each error: what `claimd reload` prints (and `--json`).
        """
        async with self._reloading:  # two SIGHUPs in a row reload one after the other
            ok, verdict = await self._reload(store, replica_id)
        if ok:
            counts = ", ".join(f"{verdict[k]['count']} {k}" for k in CHANGE_KINDS)
            result = f"reloaded: jobs {counts}"
        else:
            errors = verdict["errors"]["count"]
            result = (
                f"refused: the file has {errors} error{'s' if errors != 1 else ''}; jobs unchanged"
            )
        try:  # the record `claimd reload` waits for; a reload never fails for want of it
            await store.record_reload(
                replica_id, {"pid": os.getpid(), "path": str(self.path), **verdict}, ok, result
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("reload not recorded", error=redact(repr(exc)))
        return ok

    async def _reload(self, store: ReplicaStore, replica_id: str) -> tuple[bool, dict[str, Any]]:
        try:
            # In a thread: 100,000 jobs take seconds to read and validate, which
            # would stop every actor on the loop (starts, heartbeats) meanwhile.
            # The modules of @claimd.job are imported again: an edit takes effect.
            loaded = await asyncio.to_thread(
                load_config, self.path, env=self._env, code=CodeImport(reload=True)
            )
        except ConfigError as exc:
            # The file as a whole is unreadable (TOML, [claimd]): which jobs it
            # rejects is unknown, so the last load's record stands.
            log.error(
                "reload rejected; running jobs unchanged", path=str(self.path), errors=str(exc)
            )
            return False, _refused([exc])
        if loaded.errors:
            log.error(
                "reload rejected; running jobs unchanged",
                path=str(self.path),
                errors=str(ConfigErrors(loaded.errors)),
            )
            # Refused as a whole: every job runs as before, and the jobs this file
            # gets wrong are what an operator must fix before the next reload.
            await self._rejected(store, replica_id, loaded)
            return False, _refused(loaded.errors)
        # Materializers plan from the stored definitions, and write only while a
        # plan's definition is still the stored one: a tick racing this sync, here
        # or on another replica, cannot write the old schedule's instants.
        changes = await store.sync_jobs(list(loaded.jobs.values())) if self.syncs_jobs else {}
        changed = _changed_settings(self.loaded.settings, loaded.settings)
        if changed:
            log.warning(
                "reload applies jobs only; changed [claimd] settings take effect "
                "at the next restart",
                path=str(self.path),
                settings=changed,
            )
        self.jobs = dict(loaded.jobs)
        init_job_series(self.jobs)
        self.loaded = dataclasses.replace(loaded, settings=self.loaded.settings)
        await self._rejected(store, replica_id, loaded)
        log.info("reloaded", path=str(self.path), jobs=len(self.jobs), changes=in_brief(changes))
        if len(self.jobs) >= TRIM_AFTER_JOBS:
            # The previous config's objects went back to the heap: return them.
            await asyncio.to_thread(trim_heap)
        verdict = {k: _names([n for n, c in changes.items() if c == k]) for k in CHANGE_KINDS}
        return True, {**verdict, "settings_not_applied": changed}

    async def _rejected(self, store: ReplicaStore, replica_id: str, loaded: LoadedConfig) -> None:
        """The jobs this load rejected, in the metrics and (a scheduler's) in the database.

        Written wherever the config is read, so `claimd jobs`, the API and the
        status page name them whichever process asks; never a reason for the
        load itself to fail.
        """
        rejected = [
            RejectedJob(job=e.job, path=e.path, field=e.field_name, error=e.message)
            for e in loaded.errors
            if e.job is not None
        ]
        CONFIG_JOB_ERRORS.set(len(loaded.errors))
        CONFIG_JOB_REJECTED.clear()
        for r in rejected:
            CONFIG_JOB_REJECTED.labels(r.job).set(1)
        if not self.syncs_jobs:
            return
        try:
            await store.record_rejected_jobs(replica_id, rejected)
        except Exception as exc:  # noqa: BLE001 - the metric and the log still say it
            log.warning("rejected jobs not recorded", error=redact(repr(exc)))

    async def sync_at_start(self, store: ReplicaStore, replica_id: str) -> bool:
        """The jobs as the file says at start; invalid ones are logged and kept as they are.

        True once done (for a caller that retries it while the database is away).
        """
        for error in self.loaded.errors:
            log.error(
                "invalid job skipped; the others run",
                path=error.path,
                job=error.job,
                field=error.field_name,
                error=error.message,
            )
        if self.syncs_jobs:
            changes = await store.sync_jobs(
                list(self.jobs.values()), keep=[e.job for e in self.loaded.errors if e.job]
            )
            log.info("jobs synced", jobs=len(self.jobs), changes=in_brief(changes))
        await self._rejected(store, replica_id, self.loaded)
        return True


LISTED_CHANGES = 50
TRIM_AFTER_JOBS = 10_000  # a reload this big frees tens of MB of the old config


def in_brief(changes: dict[str, str]) -> dict[str, str] | dict[str, int | list[str]]:
    """A sync's changes for one log line: whole when few, else counted by kind with some names.

    A first sync of 100,000 jobs is 100,000 "added": one line of megabytes.
    """
    if len(changes) <= LISTED_CHANGES:
        return changes
    counted: dict[str, int | list[str]] = {}
    for kind in sorted(set(changes.values())):
        counted[kind] = sum(1 for v in changes.values() if v == kind)
    counted["some"] = sorted(changes)[:10]
    return counted
