#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC modules from fedplat/proto/fedplat.proto.
# The generated gRPC module imports its sibling top-level; we rewrite that import so
# the code lives inside the fedplat.proto package.
set -euo pipefail
OUT="${1:-$(cd "$(dirname "$0")/.." && pwd)/fedplat/proto}"
SRC="$(cd "$(dirname "$0")/.." && pwd)/fedplat/proto"
python -m grpc_tools.protoc -I"$SRC" --python_out="$OUT" --pyi_out="$OUT" \
  --grpc_python_out="$OUT" "$SRC/fedplat.proto"
sed -i 's/^import fedplat_pb2 as fedplat__pb2/from fedplat.proto import fedplat_pb2 as fedplat__pb2/' \
  "$OUT/fedplat_pb2_grpc.py"
