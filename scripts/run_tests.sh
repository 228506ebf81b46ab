#!/usr/bin/env bash
# Lint, type-check and run the default test suite. Starts a throwaway PostgreSQL
# cluster (when its binaries are installed) so the store is tested on both SQLite and
# PostgreSQL; stops it on exit whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
export PATH="$PWD/$VENV/bin:$PATH"

PGDIR=""
cleanup() {
  if [ -n "$PGDIR" ]; then bash scripts/pg_throwaway.sh stop "$PGDIR" || true; rm -rf "$PGDIR"; fi
}
trap cleanup EXIT

if [ -z "${FEDPLAT_TEST_PG_URL:-}" ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  PGDIR="$(mktemp -d /tmp/fedplat-pg.XXXXXX)"
  PGPORT="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  eval "$(bash scripts/pg_throwaway.sh start "$PGDIR" "$PGPORT")"
  export FEDPLAT_TEST_PG_URL
fi

echo "== ruff"; ruff check .; ruff format --check .
echo "== mypy"; bash scripts/typecheck.sh
echo "== pytest"; python -m pytest --durations=25 "$@"
