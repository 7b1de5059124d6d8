#!/usr/bin/env bash
# Creates a Cloud TPU VM slice: on demand with `gcloud compute tpus tpu-vm
# create`, or, with --spot, as a queued resource of Spot capacity (`gcloud
# compute tpus queued-resources create ... --spot`), which waits in a queue
# until the capacity is free and can be preempted at any time.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/create.sh --name NAME --zone ZONE --accelerator-type TYPE
                        [--version RUNTIME] [--spot] [--project PROJECT]
                        [--config FILE[:PRESET]] [--dry-run]

Creates a TPU VM slice named NAME.

  --name NAME              TPU name (default: $TPU_NAME); with --spot also the
                           queued resource's name.
  --zone ZONE              e.g. europe-west4-a (default: $ZONE).
  --accelerator-type TYPE  slice type, e.g. v3-32 (32 cores on 4 hosts), v4-64,
                           v5litepod-32, v6e-32.
  --version RUNTIME        TPU software version.  Default from TYPE:
                           tpu-ubuntu2204-base for v2/v3/v4,
                           v2-alpha-tpuv5-lite for v5litepod/v5e,
                           v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e.
  --spot                   ask for Spot capacity through a queued resource
                           (cheaper, preemptible; the request waits in a queue).
                           Watch it with:
                             gcloud compute tpus queued-resources describe NAME --zone ZONE
  --project PROJECT        Cloud project (default: gcloud's configured project,
                           or $PROJECT).
  --config FILE[:PRESET]   first compile the config's train and eval steps for
                           TYPE with the TPU compiler on this machine
                           (python -m transformer_xl.compile; needs
                           pip install 'transformer_xl[tpu-compile]', no TPU)
                           and refuse to create a slice it does not fit,
                           with the GiB per chip and a setting that fits
                           ($PYTHON, default python3, runs it).
  --dry-run                print the gcloud command, run nothing (also DRY_RUN=1).
  -h, --help               this help.

Example:
  launch/create.sh --name txl-v3-32 --zone europe-west4-a --accelerator-type v3-32 --spot
EOF
}

ACCELERATOR_TYPE=""
VERSION=""
SPOT=0
CONFIG=""

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --accelerator-type) need_value "$@"; ACCELERATOR_TYPE=$2; shift 2 ;;
    --version) need_value "$@"; VERSION=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
require "$ACCELERATOR_TYPE" --accelerator-type "e.g. v3-32"

# The runtime (OS image) that fits the TPU generation, unless given.
if [[ -z $VERSION ]]; then
  case $ACCELERATOR_TYPE in
    v2-* | v3-* | v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-* | v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) die "no default --version for accelerator type '$ACCELERATOR_TYPE'; give --version." ;;
  esac
fi

# Fit before you rent: the TPU compiler's verdict for the config on this slice.
if [[ -n $CONFIG ]]; then
  log "Compiling $CONFIG for $ACCELERATOR_TYPE with the TPU compiler (no TPU needed) ..."
  REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  set +e
  CHECK=$(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" \
    -m transformer_xl.compile "--config=$CONFIG" "--topology=$ACCELERATOR_TYPE" \
    "--json=${TMPDIR:-/tmp}/txl_compile_${NAME}.json" 2>&1)
  STATUS=$?
  set -e
  printf '%s\n' "$CHECK" | grep -E '^(train|eval):|memory per device|what makes it fit' >&2 || true
  case $STATUS in
    0) log "$CONFIG fits a $ACCELERATOR_TYPE." ;;
    3)
      die "$CONFIG does not fit a $ACCELERATOR_TYPE ($(printf '%s\n' "$CHECK" |
        grep -m1 -o '= [0-9.]* GiB of [0-9.]* GiB: DOES NOT FIT' || echo 'DOES NOT FIT')); \
nothing created. Use the setting above, or a larger slice." ;;
    *)
      die "the compile check of $CONFIG failed (exit $STATUS): $(printf '%s\n' "$CHECK" |
        grep -m1 '^error:' || printf '%s\n' "$CHECK" | tail -n 1); nothing created." ;;
  esac
fi

set_project_flag
if ((SPOT)); then
  # A queued resource holding one node (the slice) with the same name.
  run gcloud compute tpus queued-resources create "$NAME" "--node-id=$NAME" "--zone=$ZONE" \
    ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} "--accelerator-type=$ACCELERATOR_TYPE" \
    "--runtime-version=$VERSION" --spot
  log "Requested. The slice exists once the queued resource is ACTIVE:"
  log "  gcloud compute tpus queued-resources describe $NAME --zone=$ZONE"
else
  run gcloud compute tpus tpu-vm create "$NAME" "--zone=$ZONE" \
    ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} "--accelerator-type=$ACCELERATOR_TYPE" \
    "--version=$VERSION"
fi
log "Next: launch/setup.sh --name $NAME --zone $ZONE"
