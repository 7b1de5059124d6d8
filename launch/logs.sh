#!/usr/bin/env bash
# Streams the training log of one worker (default worker 0, the process that
# prints metrics and progress) until Ctrl-C; stopping the stream does not
# stop training.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'USAGE'
Usage: launch/logs.sh --name NAME --zone ZONE [--worker N] [--lines N] [--no-follow]
                      [--project PROJECT] [--dry-run]

Shows ~/txl_run/run.log (written by train.sh's restart loop) of worker N.

  --worker N     which worker (default: 0); every worker has its own log.
  --lines N      lines of history to show first (default: 100).
  --no-follow    print them and return instead of following the log.
  --name, --zone, --project, --dry-run, -h/--help: as in the other scripts.
USAGE
}

WORKER=0
LINES=100
FOLLOW=1

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --worker) need_value "$@"; WORKER=$2; shift 2 ;;
    --lines) need_value "$@"; LINES=$2; shift 2 ;;
    --no-follow) FOLLOW=0; shift ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
if [[ ! $WORKER =~ ^[0-9]+$ ]]; then
  die "--worker must be one worker's index, such as 0 (got '$WORKER')."
fi
if [[ ! $LINES =~ ^[0-9]+$ ]]; then
  die "--lines must be a whole number (got '$LINES')."
fi

# tail -F keeps following across the restart loop's appends and waits for
# the file if training has not started yet.
if ((FOLLOW)); then
  tpu_ssh "$WORKER" "tail -n $LINES -F ~/txl_run/run.log"
else
  tpu_ssh "$WORKER" "tail -n $LINES ~/txl_run/run.log"
fi
