#!/bin/sh
# Run once, at the database's first start (the postgres image runs the files of
# /docker-entrypoint-initdb.d): claimd's own role, no superuser, owning its
# own database; claimd connects as it. Its password comes from the
# environment (CLAIMD_DB_PASSWORD), never from a file of this repository.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v claimd_password="$CLAIMD_DB_PASSWORD" <<'SQL'
CREATE ROLE claimd LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'claimd_password';
CREATE DATABASE claimd OWNER claimd;
REVOKE ALL ON DATABASE claimd FROM PUBLIC;
SQL
