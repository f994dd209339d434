"""Job definitions read once per fingerprint, not on every tick or scrape.

The materializer reads every enabled job each second (ACTIVE_JOBS) and each
scrape reads every job's figures (CLUSTER_JOB_FIGURES). With the definition
text in both, 10,000 jobs cost ~120 ms a tick, ~90 of them the definitions
(jsonb rendered, sent, decoded), which change only with a reload. Those
statements now return each job's fingerprint, and the definition comes from
here: kept per job id with the fingerprint it was read with, and read again
(DEFINITIONS_OF) only for a job whose fingerprint is new.

A definition is handed out only with the fingerprint it was read with. When a
reload lands between the statement and the fetch, the fetched fingerprint is
not the one the statement saw; that job gets no definition from this read (the
next read has the new fingerprint and this definition), so a plan is never
made from a definition and a high-water mark of different versions.

Jobs with one definition (the thousands of a config on one expression, with
one executor) share one text and one fingerprint string here, and
:meth:`StoredDefinitions.fingerprint` hands out that string to whoever keeps
a fingerprint per job (the materializer's rows), rather than a copy per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

DEFINITIONS_OF = "SELECT id, fingerprint, definition FROM jobs WHERE id = ANY ($1::bigint[])"


class StoredDefinitions:
    def __init__(self) -> None:
        self._by_id: dict[int, tuple[str, str]] = {}  # job id -> (fingerprint, definition)
        # fingerprint -> the one (fingerprint, definition) pair the jobs with it share
        self._shared: dict[str, tuple[str, str]] = {}

    def fingerprint(self, fingerprint: str) -> str:
        """The string kept for ``fingerprint`` (an equal one), or ``fingerprint`` itself."""
        pair = self._shared.get(fingerprint)
        return fingerprint if pair is None else pair[0]

    async def of(
        self, pool: asyncpg.Pool, rows: Sequence[asyncpg.Record], *, every_job: bool = False
    ) -> dict[int, str]:
        """Each row's (``id``, ``fingerprint``) definition, where it is known at that fingerprint.

        ``every_job``: the rows are all the jobs kept for, so the others are forgotten.
        """
        missing = [
            r["id"] for r in rows if self._by_id.get(r["id"], ("", ""))[0] != r["fingerprint"]
        ]
        if missing:
            for f in await pool.fetch(DEFINITIONS_OF, missing):
                pair = (f["fingerprint"], f["definition"])
                self._by_id[f["id"]] = self._shared.setdefault(pair[0], pair)
        if every_job:
            seen = {r["id"] for r in rows}
            for job_id in [i for i in self._by_id if i not in seen]:
                del self._by_id[job_id]
            self._shared = {pair[0]: pair for pair in self._by_id.values()}
        out: dict[int, str] = {}
        for r in rows:
            known = self._by_id.get(r["id"])
            if known is not None and known[0] == r["fingerprint"]:
                out[r["id"]] = known[1]
        return out
