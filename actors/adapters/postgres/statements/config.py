"""Config generations and the replicas' reports of their config file (sql/0013)."""

# Read under the sync lock (LOCK_SYNC), with the sync that follows: two
# replicas judging their files at once take turns, so the second judges
# against what the first brought into force.
GENERATION_IN_FORCE = """
SELECT seq, digest, config_version, first_seen_at, replica, forced
  FROM config_generations ORDER BY seq DESC LIMIT 1
"""
DIGEST_SEEN = "SELECT EXISTS (SELECT 1 FROM config_generations WHERE digest = $1)"
RECORD_GENERATION = """
INSERT INTO config_generations (digest, config_version, replica, forced)
VALUES ($1, $2, $3, $4)
RETURNING seq, digest, config_version, first_seen_at, replica, forced
"""
# The latest generations, newest first (`claimd jobs`, /api/config).
GENERATIONS = """
SELECT seq, digest, config_version, first_seen_at, replica, forced
  FROM config_generations ORDER BY seq DESC LIMIT $1
"""
# A replica's report: one row each, replaced at every report. Rows of
# replicas gone silent are deleted by whoever reports next.
REPORT_CONFIG = """
WITH expired AS (
    DELETE FROM config_replicas WHERE expires_at < now() AND replica <> $1
)
INSERT INTO config_replicas (replica, file_digest, config_version, stale, path, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
ON CONFLICT (replica) DO UPDATE
   SET file_digest = EXCLUDED.file_digest, config_version = EXCLUDED.config_version,
       stale = EXCLUDED.stale, path = EXCLUDED.path, seen_at = now(),
       expires_at = EXCLUDED.expires_at
"""
FORGET_CONFIG_REPLICA = "DELETE FROM config_replicas WHERE replica = $1"
# The replicas reporting now (not expired), by replica.
CONFIG_REPLICAS = """
SELECT replica, file_digest, config_version, stale, path, seen_at
  FROM config_replicas WHERE expires_at >= now() ORDER BY replica
"""
