#!/usr/bin/env bash
# Regenerate fedplat/proto/*_pb2*.py(i) from the .proto files there (usage:
# gen_proto.sh [OUT_DIR]). One generator for every protocol.
#
# The code is generated with an old protoc on purpose: generated code runs on any
# protobuf runtime at least as new as the protoc that wrote it, never on an older
# one. grpcio-tools 1.66.2 writes protobuf 5.27.2 code, so fedplat runs on
# protobuf >= 5.27.2 (pyproject.toml), which Flower (protobuf < 7) shares. Those
# tools cannot share fedplat's environment (they pin protobuf < 6), so they live in
# a venv of their own under build/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/fedplat/proto"
OUT="${1:-$SRC}"
TOOLS_VERSION=1.66.2
VENV="${FEDPLAT_PROTOC_VENV:-$ROOT/build/protoc-$TOOLS_VERSION}"
if ! "$VENV/bin/python" -c "import grpc_tools" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "grpcio-tools==$TOOLS_VERSION"
fi
mkdir -p "$OUT"
"$VENV/bin/python" -m grpc_tools.protoc -I"$SRC" --python_out="$OUT" --pyi_out="$OUT" \
  --grpc_python_out="$OUT" "$SRC/common.proto" "$SRC/fedplat.proto" "$SRC/peer.proto" \
  "$SRC/control.proto"
rm -f "$OUT/common_pb2_grpc.py"  # common.proto declares no service
# Generated modules import their siblings top-level; make them package imports.
sed -i -E 's/^import (common|fedplat|peer|control)_pb2 as /from fedplat.proto import \1_pb2 as /' \
  "$OUT"/*_pb2.py "$OUT"/*_pb2_grpc.py "$OUT"/*_pb2.pyi
