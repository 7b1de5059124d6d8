#!/usr/bin/env bash
# Deletes a TPU slice (everything on its disks is lost; checkpoints in the
# gs:// workdir and datasets in the bucket stay).  A slice made with
# `create.sh --spot` is a queued resource: deleting it with --force also
# deletes its TPU.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'USAGE'
Usage: launch/delete.sh --name NAME --zone ZONE [--spot] [--yes] [--project PROJECT] [--dry-run]

  --spot, --queued  the slice was created with create.sh --spot: delete the
                    queued resource NAME and its TPU.
  --yes             do not ask for confirmation (gcloud --quiet).
  --name, --zone, --project, --dry-run, -h/--help: as in the other scripts.

Run launch/stop.sh first if training is running: it writes a checkpoint.
USAGE
}

QUEUED=0
YES=0

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --spot | --queued) QUEUED=1; shift ;;
    --yes) YES=1; shift ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
set_project_flag
quiet=()
if ((YES)); then
  quiet=(--quiet)
fi

if ((QUEUED)); then
  run gcloud compute tpus queued-resources delete "$NAME" "--zone=$ZONE" \
    ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} --force ${quiet[@]+"${quiet[@]}"}
else
  run gcloud compute tpus tpu-vm delete "$NAME" "--zone=$ZONE" \
    ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} ${quiet[@]+"${quiet[@]}"}
fi
