#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC modules from fedplat/gossip/peer.proto
# (usage: gen_proto.sh [OUT_DIR]). The generated gRPC module imports its sibling
# top-level; we rewrite that import so the code lives inside fedplat.gossip.
set -euo pipefail
SRC="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$SRC}"
python -m grpc_tools.protoc -I"$SRC" --python_out="$OUT" --pyi_out="$OUT" \
  --grpc_python_out="$OUT" "$SRC/peer.proto"
sed -i 's/^import peer_pb2 as peer__pb2/from fedplat.gossip import peer_pb2 as peer__pb2/' \
  "$OUT/peer_pb2_grpc.py"
# The repository's lint/type settings exclude only fedplat/proto's generated code,
# so these files carry their own exemptions (generated code is not hand-edited).
for f in peer_pb2.py peer_pb2_grpc.py; do
  sed -i '1i # ruff: noqa\n# mypy: ignore-errors' "$OUT/$f"
done
sed -i '1i # ruff: noqa' "$OUT/peer_pb2.pyi"
