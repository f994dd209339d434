"""Config generations: which config file a replica may apply during a rolling deploy.

The database keeps the config digests it has applied, in order (sql/0013). A
file's jobs are judged against the generation in force:

- nothing recorded yet, or a digest never seen: newer (a rollout forward); it
  becomes the generation in force;
- the digest in force: in force (nothing to record);
- a digest already seen and superseded since: stale, refused; the replica runs
  the jobs in force and says so;
- with ``config_version`` on both sides, the number decides first: a lower one
  is stale, a higher one is newer (even for a digest seen before: the explicit
  way to roll back);
- forced (``claimd reload --force``): the operator's explicit rollback; the file
  becomes the generation in force whatever the history says.

Pure: no I/O; the store reads the generation in force and whether the digest
was seen, under its sync lock, and asks :func:`judge`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

SHORT = 12  # hex characters of a digest shown to people


class Standing(StrEnum):
    """A config file's standing against the generation in force."""

    FIRST = "first"  # no generation recorded yet
    NEWER = "newer"  # never seen, or a higher config_version: a rollout forward
    IN_FORCE = "in_force"  # the generation in force
    STALE = "stale"  # superseded (or a lower config_version): refused
    FORCED = "forced"  # the operator's explicit act (claimd reload --force)

    @property
    def applies(self) -> bool:
        """The file's jobs are synced (everything but stale)."""
        return self is not Standing.STALE

    @property
    def records(self) -> bool:
        """The file becomes a new generation (in force from now on)."""
        return self in (Standing.FIRST, Standing.NEWER, Standing.FORCED)


@dataclass(frozen=True)
class ConfigIdentity:
    """What identifies a config file's jobs: their digest, and its ``config_version`` if set."""

    digest: str
    version: int | None = None

    @property
    def short(self) -> str:
        return self.digest[:SHORT]


@dataclass(frozen=True)
class Generation:
    """One recorded generation: the digest that came into force, when, by whom."""

    seq: int
    digest: str
    version: int | None
    first_seen_at: datetime
    replica: str
    forced: bool = False

    @property
    def short(self) -> str:
        return self.digest[:SHORT]


def judge(
    file: ConfigIdentity, in_force: Generation | None, *, seen_before: bool, force: bool = False
) -> Standing:
    """The file's standing; ``seen_before``: its digest is in some recorded generation."""
    if force:
        return Standing.FORCED
    if in_force is None:
        return Standing.FIRST
    if file.version is not None and in_force.version is not None:
        if file.version < in_force.version:
            return Standing.STALE
        if file.version > in_force.version:
            return Standing.NEWER
    if file.digest == in_force.digest:
        return Standing.IN_FORCE
    return Standing.STALE if seen_before else Standing.NEWER


def config_digest(jobs: Iterable[tuple[str, str, bool]], kept: Iterable[str] = ()) -> str:
    """The digest of a file's jobs: (name, definition fingerprint, enabled) of each, in name
    order, and the names of the jobs it rejected (their stored definitions are kept).

    The [claimd] settings are not in it: they differ between replicas of one
    deployment (ports, URLs) and are not the deployment's job set.
    """
    h = hashlib.sha256()
    for name, fingerprint, enabled in sorted(jobs):
        h.update(f"job\t{name}\t{fingerprint}\t{int(enabled)}\n".encode())
    for name in sorted(set(kept)):
        h.update(f"kept\t{name}\n".encode())
    return h.hexdigest()


def disagreement(file_digests: dict[str, int]) -> str | None:
    """ "replicas disagree: 2 on digest A, 1 on digest B", or None when they agree."""
    if len(file_digests) < 2:
        return None
    ordered = sorted(file_digests.items(), key=lambda kv: (-kv[1], kv[0]))
    return "replicas disagree: " + ", ".join(
        f"{count} on digest {digest[:SHORT]}" for digest, count in ordered
    )
