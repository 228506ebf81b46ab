#!/usr/bin/env bash
# mypy over the fedplat namespace as installed. The component folders (server/,
# client/, aggregators/, ui/) are mapped into fedplat.* by setuptools' package-dir,
# which mypy cannot follow through an editable install's import hook; so we build a
# tree of symlinks shaped like the installed package and check that.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
TREE="$ROOT/build/typecheck"
rm -rf "$TREE"
mkdir -p "$TREE/fedplat"
for item in "$ROOT"/fedplat/*; do
  ln -s "$item" "$TREE/fedplat/$(basename "$item")"
done
for comp in server client aggregators ui; do
  ln -s "$ROOT/$comp" "$TREE/fedplat/$comp"
done
cd "$TREE"
exec mypy --config-file "$ROOT/pyproject.toml" -p fedplat "$@"
