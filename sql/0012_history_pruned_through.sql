-- Where history retention has pruned each job's runs: the latest instant of a
-- row it deleted. `claimd audit` calls an instant at or before it with no row
-- "pruned", not "missing": retention removed it, not a fault.
ALTER TABLE jobs ADD COLUMN history_pruned_through timestamptz;
