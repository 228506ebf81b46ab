#!/usr/bin/env bash
# Docker CI step, without Docker Hub or a Docker daemon (podman, and a base image
# made locally, as on the CI machines, which reach only the package registries):
#   1. lint both Dockerfiles with hadolint (warnings fail);
#   2. make a Debian base image with debootstrap from apt's own mirror;
#   3. build the coordinator image on it with podman (FROM as a build argument);
#   4. make its certificates (fedplat certs) and enrolment tokens, run it with the
#      host network on 127.0.0.1 serving TLS, check its gRPC HEALTHCHECK, let 3
#      host-side client processes (CA + token) complete 2 rounds, stop it with
#      SIGTERM and check it exits cleanly;
#   5. remove the images it made.
# Needs root, podman, buildah, runc, debootstrap (make setup installs them) and the
# project's venv. Every process and container it starts is stopped on exit.
#
# Environment: VENV (default .venv); FEDPLAT_DOCKER_KEEP_BASE=1 reuses an existing
# base image instead of making a fresh one; FEDPLAT_WHEELS_DIR, a folder holding
# the torch wheel to install in the image (default: pip's find-links, if it has
# one; otherwise the image downloads the CPU wheel from download.pytorch.org).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"

BASE=localhost/fedplat-base:bookworm
IMAGE=localhost/fedplat-coordinator:ci
NAME="fedplat-ci-$$"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
ROUNDS_TO_COMPLETE=2
CLIENTS=3
# crun fails on these machines' cgroup setup; runc works.
PODMAN=(podman --runtime runc)

WORK="$(mktemp -d /tmp/fedplat-docker.XXXXXX)"
CLIENT_PIDS=()
cleanup() {
  local rc=$?
  for pid in "${CLIENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if "${PODMAN[@]}" container exists "$NAME" 2>/dev/null; then
    if [ "$rc" != 0 ]; then
      echo "--- container log"; "${PODMAN[@]}" logs --tail 60 "$NAME" || true
      [ -f "$WORK/podman.log" ] && { echo "--- podman"; tail -20 "$WORK/podman.log"; }
    fi
    "${PODMAN[@]}" rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
  fi
  if [ "$rc" != 0 ]; then
    for f in "$WORK"/client-*.log; do
      [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }
    done
  fi
  # The images it made go too (about 1.6 GB; the base stays only when asked to
  # be reused). The build keeps no intermediate layers (--layers=false), so
  # nothing dangling is left behind.
  podman image rm -f "$IMAGE" >/dev/null 2>&1 || true
  if [ "${FEDPLAT_DOCKER_KEEP_BASE:-0}" != 1 ]; then
    podman image rm -f "$BASE" >/dev/null 2>&1 || true
  fi
  # debootstrap mounts /proc and /sys inside the rootfs while it works; if it was
  # interrupted they may still be there, and must not be recursed into.
  grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l || true
  rm -rf --one-file-system "$WORK"
  exit "$rc"
}
trap cleanup EXIT

START=$SECONDS
step() { echo "== [$((SECONDS - START))s] $*"; }

step "hadolint"
hadolint --failure-threshold warning docker/Dockerfile.coordinator \
  docker/Dockerfile.monitor

if [ "${FEDPLAT_DOCKER_KEEP_BASE:-0}" = 1 ] && podman image exists "$BASE"; then
  step "reusing base image $BASE"
else
  # The mirror comes from apt's own sources, so this works wherever apt does and
  # no host name is written into the repository.
  MIRROR="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' \
    | awk '$2 == "bookworm" { print $1; exit }')"
  if [ -z "$MIRROR" ]; then
    echo "no bookworm mirror in apt's sources" >&2
    exit 1
  fi
  step "debootstrap bookworm from $MIRROR"
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" \
    || { tail -30 "$WORK/debootstrap.log"; exit 1; }
  step "import base image $BASE"
  tar -C "$WORK/rootfs" -c . | podman import - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

# A small build context: the files the image installs (tracked ones only).
mkdir "$WORK/context"
git ls-files -z -- pyproject.toml README.md fedplat server client aggregators ui \
  docker/grpc_health.py | tar --null -T - -c | tar -x -C "$WORK/context"

BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE")
MOUNTS=(-v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
WHEELS="${FEDPLAT_WHEELS_DIR:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}"
if [ -n "$WHEELS" ] && ls "$WHEELS"/torch-2.13.0*.whl >/dev/null 2>&1; then
  # download.pytorch.org is out of reach here: offer the local CPU wheel next to
  # PyPI (for torch's own dependencies); its "+cpu" version sorts above PyPI's
  # CUDA build of 2.13.0, so pip picks it.
  MOUNTS+=(-v "$WHEELS:/wheels:ro")
  BUILD_ARGS+=(--build-arg "TORCH_PIP_ARGS=--find-links /wheels")
fi
step "podman build $IMAGE"
# --format docker: OCI images drop HEALTHCHECK, and it is part of what we test.
podman build --isolation=chroot --network=host --pull=never --format docker \
  --layers=false \
  "${MOUNTS[@]}" "${BUILD_ARGS[@]}" \
  -f docker/Dockerfile.coordinator -t "$IMAGE" "$WORK/context" >"$WORK/build.log" \
  || { tail -40 "$WORK/build.log"; exit 1; }
podman image inspect --format '{{.Size}}' "$IMAGE" \
  | awk '{ printf "image size %.0f MiB\n", $1 / 1048576 }'

PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
ADDRESS="127.0.0.1:$PORT"
mkdir "$WORK/data"
cp docker/run.yaml "$WORK/run.yaml"
# As an operator would: certificates in the volume (the image's run.yaml serves
# TLS with them) and one enrolment token per client.
step "fedplat certs init and tokens create"
"$PY" -m fedplat.cli certs init --dir "$WORK/data/pki" --san localhost \
  --san 127.0.0.1 >/dev/null
"$PY" -m fedplat.cli tokens create --db "$WORK/data/fedplat.db" --count "$CLIENTS" \
  --run docker-ci --output "$WORK/tokens" 2>/dev/null
chown -R 10001:10001 "$WORK/data"  # the image's non-root user
step "run the coordinator image on $ADDRESS"
# The store and checkpoints land on the bind-mounted volume, where the host
# reads them; the address comes from the environment, as in production.
# --health-interval=disable: podman schedules health checks with systemd timers,
# absent here; the check is run by hand below instead. Podman still logs that it
# found no systemd, so its stderr goes to a log shown only on failure.
"${PODMAN[@]}" run -d --name "$NAME" --network=host --health-interval=disable \
  --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
  -v "$WORK/run.yaml:/etc/fedplat/run.yaml:ro" -v "$WORK/data:/var/lib/fedplat" \
  -e "FEDPLAT__SERVER__ADDRESS=$ADDRESS" -e "FEDPLAT__RUN__NAME=docker-ci" \
  -e "FEDPLAT__SELECTION__CLIENTS_PER_ROUND=$CLIENTS" \
  "$IMAGE" >/dev/null 2>>"$WORK/podman.log"

# The image's own HEALTHCHECK (the gRPC health service), run by podman.
for _ in $(seq 1 90); do
  if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1; then break; fi
  if [ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME")" != true ]; then
    echo "the coordinator container exited" >&2
    exit 1
  fi
  sleep 2
done
"${PODMAN[@]}" healthcheck run "$NAME" >/dev/null
step "healthy; starting $CLIENTS host-side clients"

for i in $(seq 0 $((CLIENTS - 1))); do
  sed -n "$((i + 1))p" "$WORK/tokens" >"$WORK/token-$i"
  OMP_NUM_THREADS=1 "$PY" -m fedplat.cli client --address "$ADDRESS" \
    --root-cert "$WORK/data/pki/ca.pem" --token-file "$WORK/token-$i" \
    --dataset digits --model mlp --model-params '{"hidden": [64]}' \
    --num-partitions "$CLIENTS" --partition-id "$i" --name "docker-client-$i" \
    --give-up-after 60 >"$WORK/client-$i.log" 2>&1 &
  CLIENT_PIDS+=($!)
done

"$PY" - "$WORK/data/fedplat.db" "$ROUNDS_TO_COMPLETE" "$CLIENTS" <<'EOF'
import sys
import time

from fedplat.store import Store

path, rounds, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        with Store(path, migrate=False) as store:
            run = store.get_run_by_name("docker-ci")
            done = [] if run is None else [
                r for r in store.list_rounds(run.id) if r.status == "completed"
            ]
    except Exception:  # the coordinator may not have created the schema yet
        done = []
    if len(done) >= rounds:
        with Store(path, migrate=False) as store:
            for r in done[:rounds]:
                ok = [
                    p for p in store.list_participations(r.run_id, r.number)
                    if p.status == "succeeded"
                ]
                print(f"round {r.number}: {len(ok)}/{r.num_selected} updates, "
                      f"accuracy {r.accuracy:.3f}")
                assert len(ok) == clients, (r, ok)
        print(f"({len(done)} rounds completed by now)")
        break
    time.sleep(1)
else:
    sys.exit(f"fewer than {rounds} rounds completed in 300 s")
EOF
step "$ROUNDS_TO_COMPLETE rounds completed; stopping the container"

# SIGTERM (podman stop) must end the run gracefully: exit 0, not a kill.
"${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null 2>>"$WORK/podman.log"
CODE="$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$NAME")"
if [ "$CODE" != 0 ]; then
  echo "coordinator exited with $CODE after SIGTERM" >&2
  exit 1
fi
step "docker CI passed"
