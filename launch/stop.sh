#!/usr/bin/env bash
# Stops training on every worker of a slice, with a checkpoint: each worker's
# restart loop gets SIGTERM, passes it to transformer_xl.main (which saves a
# checkpoint and exits 0) and does not restart it.  train.sh resumes from
# that checkpoint.  The slice keeps running (and costing): delete.sh removes it.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'USAGE'
Usage: launch/stop.sh --name NAME --zone ZONE [--timeout SECONDS] [--project PROJECT] [--dry-run]

Stops the run started by train.sh on all workers (--worker=all).

  --timeout SECONDS  how long each worker waits for the checkpoint before it
                     kills the processes (default: 900).
  --name, --zone, --project, --dry-run, -h/--help: as in the other scripts.
USAGE
}

TIMEOUT=900

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --timeout) need_value "$@"; TIMEOUT=$2; shift 2 ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
if [[ ! $TIMEOUT =~ ^[0-9]+$ ]]; then
  die "--timeout must be a whole number of seconds (got '$TIMEOUT')."
fi

tpu_ssh all "cd $REMOTE_REPO && bash launch/worker.sh stop --timeout $TIMEOUT"
