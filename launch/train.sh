#!/usr/bin/env bash
# Starts training (or evaluation) on every worker of a TPU slice at once:
# each worker runs `python3 -m transformer_xl.main` in the background under
# launch/worker.sh's restart loop, so the run survives the ssh session, and a
# crashed or killed process is restarted and resumes from the latest
# checkpoint in the gs:// workdir.  JAX finds the other workers by itself on
# a TPU VM (transformer_xl.main calls jax.distributed.initialize()).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/train.sh --name NAME --zone ZONE --config configs/FILE.py[:PRESET] --workdir gs://BUCKET/PATH
                       [--mode train|eval] [--data gs://BUCKET/tfds/txl_DATASET]
                       [--max-restarts N] [--restart-delay SECONDS]
                       [--project PROJECT] [--dry-run] [--config.KEY=VALUE ...] [-- MORE_FLAGS]

Runs transformer_xl.main on all workers (--worker=all) of the TPU slice NAME.

  --name NAME          TPU name (default: $TPU_NAME).
  --zone ZONE          its zone (default: $ZONE).
  --config FILE[:PRESET]  config file, relative to the repository root, with
                       an optional TPU slice preset (mesh, bfloat16, remat),
                       e.g. configs/enwik8_24l.py:v3-32.
  --workdir gs://...   checkpoints, metrics.jsonl, TensorBoard events; must be
                       Cloud Storage: every worker writes its shards of each
                       checkpoint there, and it outlives the slice.
  --mode MODE          train (default; resumes from the latest checkpoint in
                       the workdir) or eval (valid and test from the latest
                       checkpoint, with the config's eval settings).
  --data GS_DIR        prepared dataset (printed by prepare_data.sh); every
                       worker syncs it into ~/tensorflow_datasets before each
                       attempt.  Without it each worker prepares the dataset
                       itself (downloading the source files).
  --max-restarts N     restarts in a row before giving up (worker.sh default 10).
  --restart-delay S    seconds before a restart (worker.sh default 60).
  --config.KEY=VALUE   config overrides, passed through unchanged, e.g.
                       --config.mesh.shape='(8, 4)' --config.checkpoint.every_steps=1000
  -- FLAGS             anything after -- is passed to transformer_xl.main too.
  --project PROJECT    Cloud project (default: gcloud's configured project).
  --dry-run            print the gcloud command, run nothing (also DRY_RUN=1).
  -h, --help           this help.

Follow it with launch/logs.sh; stop it (with a checkpoint) with launch/stop.sh.
EOF
}

CONFIG=""
WORKDIR=""
MODE=train
DATA=""
WORKER_OPTIONS=()
OVERRIDES=()

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --config.*) OVERRIDES+=("$1"); shift ;;
    --workdir) need_value "$@"; WORKDIR=$2; shift 2 ;;
    --mode) need_value "$@"; MODE=$2; shift 2 ;;
    --data) need_value "$@"; DATA=$2; shift 2 ;;
    --max-restarts | --restart-delay)
      need_value "$@"
      WORKER_OPTIONS+=("$1" "$2")
      shift 2
      ;;
    --)
      shift
      OVERRIDES+=("$@")
      break
      ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1' (config overrides are --config.KEY=VALUE)."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
require "$CONFIG" --config "e.g. configs/enwik8_24l.py:v3-32"
require "$WORKDIR" --workdir "gs://BUCKET/PATH"
check_gcs_path "$WORKDIR" --workdir
if [[ $MODE != train && $MODE != eval ]]; then
  die "--mode must be train or eval (got '$MODE')."
fi
# The file part of FILE.py[:PRESET] (e.g. configs/enwik8_24l.py:v3-32, see
# transformer_xl/presets.py) must exist in this checkout, which setup.sh copies.
config_file=${CONFIG%%:*}
if [[ $config_file == /* || ! -f $REPO_DIR/$config_file ]]; then
  die "--config $CONFIG: give a path relative to the repository root that exists in this checkout ($REPO_DIR), e.g. configs/enwik8_24l.py:v3-32."
fi
if [[ -n $DATA ]]; then
  check_gcs_path "$DATA" --data
  WORKER_OPTIONS+=(--data "$DATA")
fi

# The command every worker runs, from ~/transformer_xl.
main=(python3 -m transformer_xl.main "--config=$CONFIG" "--workdir=$WORKDIR" "--mode=$MODE"
  ${OVERRIDES[@]+"${OVERRIDES[@]}"})
start=(bash launch/worker.sh start ${WORKER_OPTIONS[@]+"${WORKER_OPTIONS[@]}"} -- "${main[@]}")
tpu_ssh all "cd $REMOTE_REPO && $(shell_join "${start[@]}")"
log "Follow the log: launch/logs.sh --name $NAME --zone $ZONE"
log "Stop with a checkpoint: launch/stop.sh --name $NAME --zone $ZONE"
