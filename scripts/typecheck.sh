#!/usr/bin/env bash
# mypy over the fedplat namespace as installed. The component folders (server/,
# client/, aggregators/, ui/) are mapped into fedplat.* by setuptools' package-dir,
# which mypy cannot follow through an editable install's import hook; so we build a
# tree of symlinks shaped like the installed package and check that.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
mkdir -p "$ROOT/build"
# A private tree per run: concurrent runs must not delete each other's.
TREE="$(mktemp -d "$ROOT/build/typecheck.XXXXXX")"
trap 'rm -rf "$TREE"' EXIT
mkdir -p "$TREE/fedplat"
for item in "$ROOT"/fedplat/*; do
  ln -s "$item" "$TREE/fedplat/$(basename "$item")"
done
for comp in server client aggregators ui; do
  ln -s "$ROOT/$comp" "$TREE/fedplat/$comp"
done
cd "$TREE"
mypy --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.mypy_cache" -p fedplat "$@"
