"""SIGHUP: reread the config file and apply its jobs; a file with any error changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
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
from actors.domain import Job, decode_job
from actors.domain.generations import ConfigIdentity, Generation, Standing, config_digest
from actors.observability import (
    CONFIG_FILE_INFO,
    CONFIG_FILE_REFUSED,
    CONFIG_IN_FORCE_INFO,
    CONFIG_JOB_ERRORS,
    CONFIG_JOB_REJECTED,
    CONFIG_STALE,
    get_logger,
    init_job_series,
    redact,
)
from actors.observability.memory import trim_heap
from actors.ports import Action, RejectedJob, ReplicaStore
from actors.ports.messages import ConfigLoad, ConfigSync

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
    """The [claimd] settings whose value the file changed (applied at the next restart)."""
    return [
        name
        for name in type(old).model_fields
        if name not in APPLIED_WITH_JOBS and getattr(old, name) != getattr(new, name)
    ]


# Read at every load, with the jobs: config_version versions them, modules declares them.
APPLIED_WITH_JOBS = ("config_version", "modules")


def identity_of(loaded: LoadedConfig) -> ConfigIdentity:
    """The file's jobs as the rollout rule knows them: their digest and config_version."""
    kept = [e.job for e in loaded.errors if e.job is not None]
    digest = config_digest(
        ((j.name, j.fingerprint(), j.enabled) for j in loaded.jobs.values()), kept
    )
    return ConfigIdentity(digest, loaded.settings.config_version)


def file_bytes_digest(path: Path) -> str | None:
    """A digest of the file's bytes read through its path (None: unreadable now)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def rejected_jobs(errors: list[ConfigError]) -> list[RejectedJob]:
    """One record per rejected job (its first field), with every problem of it in the text."""
    by_job: dict[str, list[ConfigError]] = {}
    for e in errors:
        if e.job is not None:
            by_job.setdefault(e.job, []).append(e)
    records = []
    for job, found in by_job.items():
        first = found[0]
        text = first.message
        if len(found) > 1:
            text = "; ".join(
                f"field {e.field_name!r}: {e.message}" if e.field_name else e.message for e in found
            )
        records.append(RejectedJob(job=job, path=first.path, field=first.field_name, error=text))
    return records


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
        # The rollout rule (actors.domain.generations): this file's identity,
        # the generation in force as last read, and whether this file was
        # refused as older than it (then ``jobs`` are the jobs in force).
        self.file = identity_of(loaded)
        self.in_force: Generation | None = None
        self.stale = False
        # The bytes the last load read (the config watch compares the file's).
        self.loaded_bytes = file_bytes_digest(path)

    async def reload(
        self,
        store: ReplicaStore,
        replica_id: str,
        *,
        force: bool = False,
        trigger: str = "sighup",
    ) -> bool:
        """Reread the file; a file with any error changes nothing. Recorded as an action.

        The record says what changed (jobs added, changed, removed) or, refused,
        each error, or that the file is older than the generation in force:
        what `claimd reload` prints (and `--json`). ``force``: the operator's
        rollback (`claimd reload --force`), applied whatever the generations
        say. ``trigger``: what asked (sighup, forced, file changed).
        """
        async with self._reloading:  # two SIGHUPs in a row reload one after the other
            ok, verdict = await self._reload(store, replica_id, force)
        if ok:
            counts = ", ".join(f"{verdict[k]['count']} {k}" for k in CHANGE_KINDS)
            result = f"reloaded{' (forced)' if force else ''}: jobs {counts}"
        elif "stale" in verdict:
            result = verdict["stale"]
        else:
            errors = verdict["errors"]["count"]
            result = (
                f"refused: the file has {errors} error{'s' if errors != 1 else ''}; jobs unchanged"
            )
        arguments = {"pid": os.getpid(), "path": str(self.path), "trigger": trigger, **verdict}
        if force:
            arguments["force"] = True
        try:  # the record `claimd reload` waits for; a reload never fails for want of it
            await store.record_reload(
                replica_id,
                Action("reload", ok, result, arguments=arguments),
                by_signal=trigger != "file changed",
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("reload not recorded", error=redact(repr(exc)))
        return ok

    async def _reload(
        self, store: ReplicaStore, replica_id: str, force: bool
    ) -> tuple[bool, dict[str, Any]]:
        self.loaded_bytes = file_bytes_digest(self.path)
        try:
            # In a thread: 100,000 jobs take seconds to read and validate, which
            # would stop every actor on the loop (starts, heartbeats) meanwhile.
            # The modules of @claimd.job are imported again: an edit takes effect.
            loaded = await asyncio.to_thread(
                load_config, self.path, env=self._env, code=CodeImport(reload=True)
            )
        except ConfigError as exc:
            # The file as a whole is unreadable (TOML, [claimd]): which of its jobs
            # are wrong is unknown now, and the errors an earlier load recorded are
            # of a file that has changed since: the record is replaced by this
            # refusal, which names no job (its error is the reload's verdict).
            log.error(
                "reload rejected; running jobs unchanged", path=str(self.path), errors=str(exc)
            )
            await self._rejected(store, replica_id, [], file_refused=True)
            return False, _refused([exc])
        if loaded.errors:
            log.error(
                "reload rejected; running jobs unchanged",
                path=str(self.path),
                errors=str(ConfigErrors(loaded.errors)),
            )
            # Refused as a whole: every job runs as before, and the jobs this file
            # gets wrong are what an operator must fix before the next reload.
            await self._rejected(store, replica_id, loaded.errors)
            return False, _refused(loaded.errors)
        # Materializers plan from the stored definitions, and write only while a
        # plan's definition is still the stored one: a tick racing this sync, here
        # or on another replica, cannot write the old schedule's instants.
        file = await asyncio.to_thread(identity_of, loaded)
        changes: dict[str, str] = {}
        config: dict[str, Any] = {}
        if self.syncs_jobs:
            synced = await store.sync_config(
                ConfigLoad(list(loaded.jobs.values()), file), replica_id, force=force
            )
            config = self._judged(file, synced)
            if synced.standing is Standing.STALE:
                # Refused as older, not for an error: no job of this file is rejected.
                await self._rejected(store, replica_id, loaded.errors)
                await self._run_in_force(store)
                self.loaded = dataclasses.replace(loaded, settings=self.loaded.settings)
                return False, {
                    "errors": {"count": 0, "messages": []},
                    "stale": refused_as_stale(file, synced.in_force),
                    "config": config,
                }
            changes = dict(synced.changes)
        else:
            self.file = file
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
        await self._rejected(store, replica_id, loaded.errors)
        log.info("reloaded", path=str(self.path), jobs=len(self.jobs), changes=in_brief(changes))
        if len(self.jobs) >= TRIM_AFTER_JOBS:
            # The previous config's objects went back to the heap: return them.
            await asyncio.to_thread(trim_heap)
        verdict = {k: _names([n for n, c in changes.items() if c == k]) for k in CHANGE_KINDS}
        return True, {**verdict, "settings_not_applied": changed, "config": config}

    async def _rejected(
        self,
        store: ReplicaStore,
        replica_id: str,
        errors: list[ConfigError],
        *,
        file_refused: bool = False,
    ) -> None:
        """The jobs this load rejected, in the metrics and (a scheduler's) in the database;
        every load replaces what the last one recorded, whatever refused it.

        Written wherever the config is read, so `claimd jobs`, the API and the
        status page name them whichever process asks; never a reason for the
        load itself to fail. ``file_refused``: the file was refused as a whole.
        """
        rejected = rejected_jobs(errors)
        CONFIG_FILE_REFUSED.set(1 if file_refused else 0)
        CONFIG_JOB_ERRORS.set(len(errors))
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
            keep = [e.job for e in self.loaded.errors if e.job]
            synced = await store.sync_config(
                ConfigLoad(list(self.jobs.values()), self.file, keep), replica_id
            )
            self._judged(self.file, synced)
            if synced.standing is Standing.STALE:
                await self._run_in_force(store)
            else:
                log.info("jobs synced", jobs=len(self.jobs), changes=in_brief(dict(synced.changes)))
        await self._rejected(store, replica_id, self.loaded.errors)
        return True

    def _judged(self, file: ConfigIdentity, synced: ConfigSync) -> dict[str, Any]:
        """This file's standing, remembered, in the metrics and the log; its record."""
        self.file = file
        self.in_force = synced.in_force
        self.stale = synced.standing is Standing.STALE
        self.show()
        # Which file: every line about its standing names it the same way.
        named = {"path": str(self.path), "digest": file.short, "config_version": file.version}
        if self.stale:
            log.warning(
                "config file older than the generation in force; running the jobs in force",
                **named,
                in_force=synced.in_force.short,
                in_force_version=synced.in_force.version,
                in_force_since=synced.in_force.first_seen_at.isoformat(),
                hint="claimd reload --force rolls back to this file",
            )
        elif synced.standing.records:
            log.info(
                "config generation in force",
                **named,
                generation=synced.in_force.seq,
                standing=synced.standing.value,
            )
        return {
            "digest": file.short,
            "config_version": file.version,
            "standing": synced.standing.value,
            "in_force": synced.in_force.short,
            "generation": synced.in_force.seq,
        }

    def show(self) -> None:
        """The rollout gauges of this replica: its file, the generation in force, stale."""
        CONFIG_STALE.set(1 if self.stale else 0)
        CONFIG_FILE_INFO.clear()
        CONFIG_FILE_INFO.labels(self.file.short).set(1)
        if self.in_force is not None:
            CONFIG_IN_FORCE_INFO.clear()
            CONFIG_IN_FORCE_INFO.labels(self.in_force.short).set(1)

    async def _run_in_force(self, store: ReplicaStore) -> None:
        """The jobs in force (the stored definitions) become this replica's jobs."""
        states = await store.active_jobs()
        jobs: dict[str, Job] = {}
        for name, state in states.items():
            try:
                jobs[name] = decode_job(name, state.definition)
            except Exception as exc:  # noqa: BLE001 - the materializer says it too
                log.warning("stored job definition unreadable", job=name, error=repr(exc))
        self.jobs = jobs
        init_job_series(self.jobs)


def refused_as_stale(file: ConfigIdentity, in_force: Generation) -> str:
    """A stale file's verdict line (what `claimd reload` prints)."""
    ours = f"digest {file.short}" + (
        f", config_version {file.version}" if file.version is not None else ""
    )
    theirs = f"digest {in_force.short}" + (
        f", config_version {in_force.version}" if in_force.version is not None else ""
    )
    return (
        f"refused: the file ({ours}) is older than the generation in force ({theirs}, since "
        f"{in_force.first_seen_at.isoformat(timespec='seconds')}); running the jobs in force "
        "(claimd reload --force rolls back to this file)"
    )


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
