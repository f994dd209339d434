-- A job's fingerprint becomes the sha256 (hex) of the canonical JSON text it
-- was until now (actors.domain.jobs.Job.fingerprint computes the same digest).
-- The text was the whole definition again, kept per job in every replica's
-- memory beside the definition (several copies: the catalog's cache, the
-- materializer's rows, the metrics' periods); at 100,000 jobs that was
-- hundreds of MB. The digest of the old text is what the new code computes
-- for the same job, so no job looks edited after this migration. A row whose
-- fingerprint is already a digest (64 hex digits: never a JSON text, which
-- starts with '{') is left as it is.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN EXCLUSIVE MODE
-- lock: job_catalog_version IN EXCLUSIVE MODE
UPDATE jobs
   SET fingerprint = encode(sha256(convert_to(fingerprint, 'UTF8')), 'hex')
 WHERE fingerprint !~ '^[0-9a-f]{64}$';
