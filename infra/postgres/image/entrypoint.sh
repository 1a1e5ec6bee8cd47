# Entrypoint of the lodestream/postgres image: initdb on first start, then the server.
# Run by dash with no other tools in the image: builtins only (no mktemp, no rm, no psql).
#   POSTGRES_PASSWORD  the superuser's password (required on first start; scram-sha-256)
#   POSTGRES_USER      the superuser (default postgres)
#   POSTGRES_DB        a database created on first start (optional)
# Extra arguments go to postgres (e.g. -c max_connections=200).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
user="${POSTGRES_USER:-postgres}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "entrypoint: set POSTGRES_PASSWORD for the first start" >&2
    exit 1
  fi
  # The password goes through a pipe, never a file in the image or the volume.
  printf '%s\n' "$POSTGRES_PASSWORD" | initdb -D "$PGDATA" -U "$user" --pwfile=/dev/stdin \
    --auth=scram-sha-256 --encoding=UTF8 --no-locale
  # initdb allows loopback only; clients reach this server over the container network.
  printf '%s\n' "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ]; then
    printf 'CREATE DATABASE "%s";\n' "$POSTGRES_DB" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
