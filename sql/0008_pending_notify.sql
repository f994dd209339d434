-- Runs becoming pending are announced on the channel claimd_runs_pending, so a
-- claimer listening wakes for a run due before its next poll (a trigger, a
-- backfill, a retry, a reaped or released claim, a new job's first instants)
-- instead of waiting for it. The payload is the schema (claimers of other
-- schemas of the database ignore it) and the soonest due_at among the new
-- pending rows, in epoch seconds rounded down to a tenth: rows of one instant
-- then dedupe to one notification per transaction (PostgreSQL folds identical
-- ones), and a claimer woken a little early only reads the next due instant.
--
-- Inserts: once per statement, over the inserted rows (a materializer tick
-- writes hundreds). Updates: per row, and only for the rows an UPDATE of state
-- or due_at turns pending (the WHEN is checked without calling the function),
-- so claims, starts, completions and heartbeats pay nothing.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: job_runs IN SHARE ROW EXCLUSIVE MODE
CREATE FUNCTION claimd_pending_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    soonest timestamptz;
BEGIN
    SELECT min(due_at) INTO soonest FROM inserted_runs WHERE state = 'pending';
    IF soonest IS NOT NULL THEN
        PERFORM pg_notify('claimd_runs_pending',
                          current_schema() || ' ' || floor(extract(epoch FROM soonest) * 10) / 10);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION claimd_pending_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('claimd_runs_pending',
                      current_schema() || ' ' || floor(extract(epoch FROM NEW.due_at) * 10) / 10);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_runs_pending_inserted AFTER INSERT ON job_runs
    REFERENCING NEW TABLE AS inserted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION claimd_pending_inserted();

CREATE TRIGGER job_runs_pending_updated AFTER UPDATE OF state, due_at ON job_runs
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND (OLD.state <> 'pending' OR NEW.due_at < OLD.due_at))
    EXECUTE FUNCTION claimd_pending_updated();
