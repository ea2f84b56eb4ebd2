#!/usr/bin/env bash
# `make images`: build ebb:cpu and ebb-runner:cuda with buildah, then run ebb:cpu with
# podman and ask `ebb up` inside it for the capital of France through a port published
# on 127.0.0.1. No registry is reachable here, so both build FROM a base made from
# Debian packages (debootstrap, then `podman import`) through the BASE_IMAGE build arg;
# the Dockerfiles' defaults are the usual public images. As root (Debian's podman 4.3).
#   EBB_IMAGES=cpu|cuda|all (all)   EBB_IMAGES_WORK (/var/tmp/ebb-images)   EBB_IMAGES_PORT (18080)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${EBB_IMAGES_WORK:-/var/tmp/ebb-images}
PORT=${EBB_IMAGES_PORT:-18080}
WHICH=${EBB_IMAGES:-all}
BASE=localhost/ebb-base:bookworm
MIRROR=${EBB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$WORK"

for tool in buildah podman runc debootstrap; do
  command -v "$tool" >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman runc debootstrap
    break
  }
done
# Debian's podman runs here with runc, cgroupfs and no default ulimits (crun cannot set
# rlimits in this sandbox); see /work/shared/ENVIRONMENT.md.
export CONTAINERS_CONF=$WORK/containers.conf
printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"
podman=(podman --runtime runc --cgroup-manager cgroupfs)
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

base() {
  if "${podman[@]}" image exists "$BASE"; then return; fi
  stamp "base: debootstrap bookworm"
  local root=$WORK/rootfs
  rm -rf "$root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$root" "$MIRROR" >"$WORK/debootstrap.log"
  # This machine's certificate bundle and pip settings (its index, its wheel folder):
  # the base is for building here, never pushed.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nfind-links = /opt/wheels\ndefault-timeout = 180\n' \
    >"$root/etc/pip.conf"
  if [ -f /etc/xdg/pip/constraints.txt ]; then
    mkdir -p "$root/etc/xdg/pip" && cp /etc/xdg/pip/constraints.txt "$root/etc/xdg/pip/"
    printf 'constraint = /etc/xdg/pip/constraints.txt\n' >>"$root/etc/pip.conf"
  fi
  rm -rf "$root/var/cache/apt/archives/"*.deb
  tar -C "$root" -c . | "${podman[@]}" import - "$BASE" >/dev/null
  rm -rf "$root"
}

build() {  # build NAME DOCKERFILE [extra buildah args]
  local name=$1 file=$2
  shift 2
  stamp "build $name ($file)"
  buildah bud --isolation chroot --network host --layers --format docker --build-arg "BASE_IMAGE=$BASE" \
    -f "$file" -t "$name" "$@" . 2>&1 | tee "$WORK/build-${name//[:\/]/-}.log" | grep -E '^(STEP|COMMIT|Error)' || true
  "${podman[@]}" image exists "$name" || { stamp "build of $name failed: $WORK/build-${name//[:\/]/-}.log"; exit 1; }
}

CID=""
stop_container() { if [ -n "$CID" ]; then "${podman[@]}" stop -t 5 "$CID" >/dev/null 2>&1 || true; fi; }
trap stop_container EXIT

answer_paris() {
  local key reply
  key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  stamp "run ebb:cpu (ebb up) on 127.0.0.1:$PORT"
  CID=$("${podman[@]}" run -d --rm -p "127.0.0.1:$PORT:8000" \
    -e EBB_HOST=0.0.0.0 -e EBB_ADMIN_KEY="$key" ebb:cpu ebb up)
  for _ in $(seq 1 180); do  # the model's conversion and first load: minutes on 2 cores
    reply=$(curl -sf -m 120 "http://127.0.0.1:$PORT/v1/chat/completions" \
      -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
      -d '{"model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 20,
           "messages": [{"role": "user", "content": "What is the capital of France?"}]}' || true)
    if [ -n "$reply" ]; then break; fi
    "${podman[@]}" container exists "$CID" || { stamp "the container exited"; exit 1; }
    sleep 5
  done
  echo "$reply"
  if grep -q Paris <<<"$reply"; then stamp "ebb:cpu answered Paris"; else
    "${podman[@]}" logs "$CID" 2>&1 | tail -40; stamp "no Paris"; exit 1
  fi
}

base
if [ "$WHICH" != cuda ]; then
  build ebb:cpu infra/docker/Dockerfile.cpu -v /opt/wheels:/opt/wheels:ro
  "${podman[@]}" tag ebb:cpu ebb-runner:cpu
fi
if [ "$WHICH" != cpu ]; then
  build ebb-runner:cuda infra/docker/Dockerfile.cuda
  "${podman[@]}" run --rm ebb-runner:cuda python -c \
    'import os, shutil, sysconfig, vllm
assert shutil.which("gcc"), "Triton needs a C compiler"
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")), "and the headers"
print("vllm", vllm.__version__, "imports without a GPU; gcc and Python.h present")'
fi
if [ "$WHICH" != cuda ]; then answer_paris; fi
stamp "done"
