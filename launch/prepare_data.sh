#!/usr/bin/env bash
# Prepares a dataset once, on one worker (worker 0), and stores the prepared
# tfds dataset in Cloud Storage; train.sh --data then copies it onto every
# worker, of this slice or of a later one, instead of each worker downloading
# and tokenising the corpus again.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/prepare_data.sh --name NAME --zone ZONE --dataset DATASET --bucket gs://BUCKET/tfds
                              [--manual-from gs://BUCKET/raw/DATASET] [--worker N]
                              [--project PROJECT] [--dry-run]

On worker N (default 0) of the TPU slice NAME: builds the tfds dataset
txl_DATASET in ~/tensorflow_datasets (downloading the canonical source files,
checksums verified), then copies it to gs://BUCKET/tfds/txl_DATASET with
`gcloud storage rsync`.

  --dataset DATASET   a name that transformer_xl.data.load_corpus knows
                      (CORPUS_NAMES), e.g. enwik8, text8, wikitext103.
  --bucket GS_DIR     where prepared datasets are kept, e.g. gs://my-bucket/tfds.
  --manual-from GS_DIR  source files already in Cloud Storage (the archive or
                      the extracted files, as for --config.data.manual_dir);
                      copied to ~/txl_manual/DATASET on the worker and used
                      instead of downloading.
  --worker N          the worker that prepares the data (default: 0).
  --name, --zone, --project, --dry-run, -h/--help: as in the other scripts.

Then train with: launch/train.sh ... --data gs://BUCKET/tfds/txl_DATASET
EOF
}

DATASET=""
BUCKET=""
MANUAL_FROM=""
WORKER=0

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --dataset) need_value "$@"; DATASET=$2; shift 2 ;;
    --bucket) need_value "$@"; BUCKET=$2; shift 2 ;;
    --manual-from) need_value "$@"; MANUAL_FROM=$2; shift 2 ;;
    --worker) need_value "$@"; WORKER=$2; shift 2 ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
require "$DATASET" --dataset "e.g. enwik8"
require "$BUCKET" --bucket "e.g. gs://my-bucket/tfds"
check_dataset "$DATASET"
check_gcs_path "$BUCKET" --bucket
if [[ -n $MANUAL_FROM ]]; then
  check_gcs_path "$MANUAL_FROM" --manual-from
fi
if [[ ! $WORKER =~ ^[0-9]+$ ]]; then
  die "--worker must be a worker index such as 0 (got '$WORKER')."
fi

builder="txl_$DATASET"
target="${BUCKET%/}/$builder"

# Step 1 (optional): the source files from Cloud Storage into a manual dir.
steps="set -e; cd $REMOTE_REPO"
manual_arg=None
if [[ -n $MANUAL_FROM ]]; then
  steps+=" && mkdir -p ~/txl_manual/$DATASET"
  steps+=" && gcloud storage rsync --recursive $(shell_quote "$MANUAL_FROM") ~/txl_manual/$DATASET"
  manual_arg="os.path.expanduser(\"~/txl_manual/$DATASET\")"
fi
# Step 2: build the dataset with the package's own loader (it checks the
# source checksums and the documented token counts) and print the split sizes.
# (One line of Python, so that a dry run prints one line per command.)
code="import os; from transformer_xl import data; "
code+="corpus = data.load_corpus(\"$DATASET\", data_dir=os.path.expanduser(\"~/tensorflow_datasets\"), manual_dir=$manual_arg); "
code+="print({name: split.num_tokens for name, split in corpus.splits.items()}, flush=True)"
steps+=" && python3 -c $(shell_quote "$code")"
# Step 3: the prepared dataset to Cloud Storage.
steps+=" && gcloud storage rsync --recursive ~/tensorflow_datasets/$builder $(shell_quote "$target")"

tpu_ssh "$WORKER" "$steps"
log "The prepared dataset goes to $target; train with:"
log "  launch/train.sh --name $NAME --zone $ZONE --data $target --config ... --workdir gs://..."
