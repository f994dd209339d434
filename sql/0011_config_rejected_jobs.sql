-- The jobs the config file declares and the replica refused (a bad cron, an
-- unknown key...), with the loader's error: `claimd jobs`, the API and the
-- status page list them, whichever process asks.
--
-- The config is deployment-wide, as the jobs table is: the replica that last
-- loaded the file (at start, or a reload, accepted or refused) replaces the
-- whole set, as its sync replaces the definitions. A rejected job that is in
-- `jobs` and enabled still runs its old definition; one that is not, never ran.
CREATE TABLE config_rejected_jobs (
    job         text        PRIMARY KEY,
    path        text        NOT NULL,
    field       text,
    error       text        NOT NULL,
    replica     text        NOT NULL,   -- the replica whose load found it
    recorded_at timestamptz NOT NULL DEFAULT now()
);
