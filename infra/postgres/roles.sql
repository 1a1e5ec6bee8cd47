-- Least-privilege roles for a production (managed) Postgres. Not used by tests or by
-- the embedded `lode up` stack, which connect as the superuser over loopback.
--
-- Who may do what:
--   lode_owner      NOLOGIN; owns the schema rm and every table. Nobody logs in as it.
--   lode_migrator   LOGIN, member of lode_owner: runs `alembic upgrade` (infra/postgres/migrate.py)
--                   and the projector's `rebuild` swap (renaming schemas needs ownership).
--   lode_api        LOGIN: reads the read models; reads and writes only its own auth tables
--                   (public.users, public.api_tokens). It never writes rm: the API appends
--                   events, the projector folds them.
--   lode_projector  LOGIN: writes the read models (rows and its stream position, in one
--                   transaction). No access to the auth tables.
--
-- Run as an administrator, once, before the first migration; replace the passwords (or
-- use your platform's IAM authentication). Re-running is safe. Then run, after every
-- migration that adds tables to public, the GRANTs at the end (the DEFAULT PRIVILEGES
-- cover new tables in rm).

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_owner') THEN
        CREATE ROLE lode_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_migrator') THEN
        CREATE ROLE lode_migrator LOGIN PASSWORD 'change-me' IN ROLE lode_owner;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_api') THEN
        CREATE ROLE lode_api LOGIN PASSWORD 'change-me';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_projector') THEN
        CREATE ROLE lode_projector LOGIN PASSWORD 'change-me';
    END IF;
END
$$;

-- The database itself (here: lodestream) belongs to the owner role; nobody else creates in it.
ALTER DATABASE lodestream OWNER TO lode_owner;
REVOKE ALL ON DATABASE lodestream FROM PUBLIC;
GRANT CONNECT ON DATABASE lodestream TO lode_api, lode_projector;
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE lodestream TO lode_migrator;

-- public holds alembic_version and the API's auth tables.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO lode_owner;

-- The migration creates rm (CREATE SCHEMA IF NOT EXISTS); creating it here, owned by
-- lode_owner, lets the privileges below be granted before the first migration.
CREATE SCHEMA IF NOT EXISTS rm AUTHORIZATION lode_owner;
REVOKE ALL ON SCHEMA rm FROM PUBLIC;
GRANT USAGE ON SCHEMA rm TO lode_api, lode_projector;

-- Tables the migrator creates (as lode_owner: `SET ROLE lode_owner` in the session, or make
-- lode_owner the default with `ALTER ROLE lode_migrator SET role = 'lode_owner'`).
ALTER ROLE lode_migrator SET role = 'lode_owner';
ALTER DEFAULT PRIVILEGES FOR ROLE lode_owner IN SCHEMA rm
    GRANT SELECT ON TABLES TO lode_api;
ALTER DEFAULT PRIVILEGES FOR ROLE lode_owner IN SCHEMA rm
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO lode_projector;

-- Existing tables (after the first migration, and harmless to repeat).
GRANT SELECT ON ALL TABLES IN SCHEMA rm TO lode_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA rm TO lode_projector;

DO $$
BEGIN
    IF to_regclass('public.users') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.users, public.api_tokens TO lode_api;
        -- Services check the schema version at start-up; only the migrator changes it.
        GRANT SELECT ON public.alembic_version TO lode_api, lode_projector;
    END IF;
END
$$;

-- Statement limits that keep one slow query from holding the read models hostage.
ALTER ROLE lode_api SET statement_timeout = '30s';
ALTER ROLE lode_api SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE lode_projector SET idle_in_transaction_session_timeout = '5min';
