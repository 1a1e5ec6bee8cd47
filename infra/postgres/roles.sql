-- Least-privilege roles for a production (managed) Postgres: the model the embedded
-- `lode up` stack applies by itself (infra/postgres/roles.py), plus an owner and a
-- migrator so that nobody logs in as a superuser.
--
-- Who may do what:
--   lode_owner       NOLOGIN; owns the database and the API's auth tables in public.
--   lode_migrator    LOGIN, member of lode_owner and of lode_projector: runs `lode migrate`
--                    (infra/postgres/migrate.py) and this file's "after every migration" part.
--   lode_projector   LOGIN; owns schema rm and every table in it: writes the read models
--                    (rows, stream position, quarantine, temp tables) and runs `lode projector
--                    rebuild`, which creates rm_rebuild and renames it over rm (only an owner
--                    may). rm is derived from the log; owning it grants nothing the log cannot
--                    restore. No access to the auth tables.
--   lode_api         LOGIN: reads rm; reads and writes only its own auth tables
--                    (public.users, public.api_tokens, public.monitoring_keys,
--                    public.bound_keys). It never writes rm: the API appends
--                    events, the projector folds them.
--   lode_controller  LOGIN: reads rm, public.monitoring_keys and public.bound_keys (public
--                    keys the credential sync renders); writes the sync's own state
--                    (public.credential_sync, public.credential_rejects). The api reads it.
--
-- Run as an administrator, once, before the first migration; replace the passwords (or
-- use your platform's IAM authentication). Re-running is safe. Run the part marked "after
-- every migration" again after each `lode migrate`.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_owner') THEN
        CREATE ROLE lode_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_projector') THEN
        CREATE ROLE lode_projector LOGIN PASSWORD 'change-me';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_migrator') THEN
        CREATE ROLE lode_migrator LOGIN PASSWORD 'change-me' IN ROLE lode_owner, lode_projector;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_api') THEN
        CREATE ROLE lode_api LOGIN PASSWORD 'change-me';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lode_controller') THEN
        CREATE ROLE lode_controller LOGIN PASSWORD 'change-me';
    END IF;
END
$$;

-- The database itself (here: lodestream) belongs to the owner role: only it (and a
-- superuser) may drop it.
ALTER DATABASE lodestream OWNER TO lode_owner;
REVOKE ALL ON DATABASE lodestream FROM PUBLIC;
GRANT CONNECT ON DATABASE lodestream TO lode_api, lode_controller;
-- CREATE: a rebuild creates schema rm_rebuild; TEMPORARY: each batch stages in a temp table.
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE lodestream TO lode_projector;
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE lodestream TO lode_migrator;

-- public holds alembic_version and the API's auth tables.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO lode_owner;

-- The migration creates rm (CREATE SCHEMA IF NOT EXISTS); creating it here, owned by the
-- projector, lets the privileges below be granted before the first migration.
CREATE SCHEMA IF NOT EXISTS rm AUTHORIZATION lode_projector;
ALTER SCHEMA rm OWNER TO lode_projector;
REVOKE ALL ON SCHEMA rm FROM PUBLIC;
GRANT USAGE ON SCHEMA rm TO lode_api, lode_controller;
GRANT USAGE, CREATE ON SCHEMA rm TO lode_owner;

-- Tables the migrator creates belong to lode_owner (its default role); those in rm are handed
-- to the projector below.
ALTER ROLE lode_migrator SET role = 'lode_owner';

-- Not IN SCHEMA rm: a rebuild creates rm_rebuild and its tables, then renames it to rm.
ALTER DEFAULT PRIVILEGES FOR ROLE lode_projector GRANT USAGE ON SCHEMAS TO lode_api, lode_controller;
ALTER DEFAULT PRIVILEGES FOR ROLE lode_projector GRANT SELECT ON TABLES TO lode_api, lode_controller;

-- Statement limits that keep one slow query from holding the read models hostage.
ALTER ROLE lode_api SET statement_timeout = '30s';
ALTER ROLE lode_api SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE lode_controller SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE lode_projector SET idle_in_transaction_session_timeout = '5min';

-- --- after every migration (harmless to repeat) ---------------------------------------------

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT schemaname, tablename FROM pg_tables
        WHERE schemaname IN ('rm', 'rm_rebuild') AND tableowner <> 'lode_projector'
    LOOP
        EXECUTE format('ALTER TABLE %I.%I OWNER TO lode_projector', t.schemaname, t.tablename);
    END LOOP;
END
$$;
GRANT SELECT ON ALL TABLES IN SCHEMA rm TO lode_api, lode_controller;

DO $$
BEGIN
    IF to_regclass('public.users') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.users, public.api_tokens TO lode_api;
    END IF;
    IF to_regclass('public.monitoring_keys') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.monitoring_keys TO lode_api;
        -- public keys only: what the credential sync renders into nats-server's config
        GRANT SELECT ON public.monitoring_keys TO lode_controller;
    END IF;
    IF to_regclass('public.bound_keys') IS NOT NULL THEN
        -- One key, one principal: the api binds keys here in the binding's own transaction.
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.bound_keys TO lode_api;
        GRANT SELECT ON public.bound_keys TO lode_controller;
        -- The credential sync's state: written by `lode up`, shown by the api.
        GRANT SELECT, INSERT, UPDATE, DELETE ON public.credential_sync, public.credential_rejects
            TO lode_controller;
        GRANT SELECT ON public.credential_sync, public.credential_rejects TO lode_api;
    END IF;
END
$$;
