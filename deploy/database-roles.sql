-- The database role of lumio-ingestd, with only the privileges it needs.
--
-- Run once, as a PostgreSQL superuser, on a database that exists already:
--
--     psql -v db=lumio -v role=lumio -f database-roles.sql
--
-- (db and role default to lumio). Then give the role a password
-- (\password lumio) or let it in by peer authentication. The same role
-- runs `lumio-ingestd migrate` and the daemon: migrate creates the tables,
-- so the role owns them and needs no grant on them.
--
-- CONNECT              log in to the database
-- CREATE (database)    CREATE EXTENSION timescaledb, once, where TimescaleDB is preloaded
--                      (a trusted extension: no superuser needed)
-- TEMPORARY            the daemon writes chat through per-connection temporary tables
-- USAGE, CREATE        the tables live in schema public (PostgreSQL 15 and later no
--   (schema public)    longer let every role create there)
--
-- Nothing else: not superuser, not pg_read_all_settings.
\set ON_ERROR_STOP on
\if :{?db}
\else
\set db lumio
\endif
\if :{?role}
\else
\set role lumio
\endif

SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE', :'role')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE :"db" TO :"role";
\connect :"db"
GRANT USAGE, CREATE ON SCHEMA public TO :"role";
