-- Where history retention has pruned each job's runs: the latest instant of a
-- row it deleted. `claimd audit` calls an instant at or before it with no row
-- "pruned", not "missing": retention removed it, not a fault.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN ACCESS EXCLUSIVE MODE
ALTER TABLE jobs ADD COLUMN history_pruned_through timestamptz;
