-- Config generations (docs/rollout.md): the config digests the deployment has
-- applied, in order. The row with the highest seq is the generation in force.
-- A sync (start or reload) from a file whose digest was seen before and has
-- been superseded since (or whose config_version is lower than the one in
-- force) is refused: that replica runs the jobs in force and says so. A digest
-- never seen is a rollout forward and gets a row; `claimd reload --force` (the
-- operator's rollback) gets one too, marked forced, even for an old digest.
-- Read and written under the sync lock (statements/jobs.py: LOCK_SYNC).
CREATE TABLE config_generations (
    seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest         text        NOT NULL,   -- actors.domain.generations.config_digest
    config_version bigint,                 -- [claimd] config_version of the file, if set
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    replica        text        NOT NULL,   -- the replica whose sync brought it into force
    forced         boolean     NOT NULL DEFAULT false
);
CREATE INDEX config_generations_digest ON config_generations (digest);

-- Each replica's report of its config file (at every sync and every
-- config_poll): what its file says and whether that file was refused as
-- stale. A row whose replica stopped reporting expires (expires_at); a
-- replica that stops cleanly deletes its own. Read for the disagreement:
-- "replicas disagree: 2 on digest A, 1 on digest B".
CREATE TABLE config_replicas (
    replica        text        PRIMARY KEY,
    file_digest    text        NOT NULL,
    config_version bigint,
    stale          boolean     NOT NULL,
    path           text        NOT NULL,
    seen_at        timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
