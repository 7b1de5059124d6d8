#!/usr/bin/env bash
# Installs transformer_xl with its [tpu] extra (JAX for TPU) on every worker of a slice, into
# ~/transformer_xl (an editable pip install), from a copy of this checkout
# (default) or from a git clone.  Then checks that JAX sees the whole slice.
# Re-running replaces ~/transformer_xl with the new code.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/setup.sh --name NAME --zone ZONE [--repo-url URL [--ref REF]]
                       [--jax-spec SPEC] [--project PROJECT] [--dry-run]

Installs the package on all workers of the TPU slice NAME (--worker=all).

  --name NAME       TPU name (default: $TPU_NAME).
  --zone ZONE       its zone (default: $ZONE).
  --repo-url URL    clone this git repository on every worker instead of
                    copying this checkout (uncommitted changes included).
  --ref REF         branch or tag to clone (git clone --branch); default: the
                    repository's default branch.
  --jax-spec SPEC   an extra pip requirement for JAX on TPU, e.g. a pin such
                    as 'jax[tpu]==0.10.2' to match the version you tested
                    (default: none; the package's [tpu] extra brings jax[tpu]).
  --project PROJECT Cloud project (default: gcloud's configured project).
  --dry-run         print the commands, run nothing (also DRY_RUN=1).
  -h, --help        this help.

Without --repo-url the checkout is packed (without .git, workdirs/ and caches)
into $TMPDIR/transformer_xl-src.tar.gz and copied to every worker with
`gcloud compute tpus tpu-vm scp`.
EOF
}

REPO_URL=""
REF=""
JAX_SPEC=""

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --repo-url) need_value "$@"; REPO_URL=$2; shift 2 ;;
    --ref) need_value "$@"; REF=$2; shift 2 ;;
    --jax-spec) need_value "$@"; JAX_SPEC=$2; shift 2 ;;
    *)
      parse_common_option "$@" || die "unknown argument '$1'."
      shift "$SHIFT_BY"
      ;;
  esac
done

require_tpu
if [[ -n $REF && -z $REPO_URL ]]; then
  die "--ref needs --repo-url (without it this checkout is copied as it is)."
fi

# Step 1: put the source code into ~/transformer_xl on every worker.
if [[ -n $REPO_URL ]]; then
  clone=(git clone --depth 1)
  if [[ -n $REF ]]; then
    clone+=(--branch "$REF")
  fi
  clone+=("$REPO_URL")
  fetch="rm -rf $REMOTE_REPO && $(shell_join "${clone[@]}") $REMOTE_REPO"
else
  archive="${TMPDIR:-/tmp}/transformer_xl-src.tar.gz"
  run tar -czf "$archive" -C "$REPO_DIR" --exclude=./.git --exclude=./workdirs \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude='*.egg-info' .
  set_project_flag
  run gcloud compute tpus tpu-vm scp "$archive" "$NAME:transformer_xl-src.tar.gz" \
    "--zone=$ZONE" ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} --worker=all
  fetch="rm -rf $REMOTE_REPO && mkdir -p $REMOTE_REPO && tar -xzf ~/transformer_xl-src.tar.gz -C $REMOTE_REPO"
fi

# Step 2: one pip call installs the package (editable) with its [tpu] extra
# (JAX for TPU) and any --jax-spec pin, so that pip resolves a consistent set.  Then every worker runs the same JAX
# program at once (worker.sh check): it joins the slice the way
# transformer_xl.main does (jax.distributed on a TPU VM) and prints what it
# sees, e.g. 32 devices on a v3-32 from each of its 4 workers.
jax_pin=""
[[ -n $JAX_SPEC ]] && jax_pin="$(shell_quote "$JAX_SPEC") "
install="python3 -m pip install --upgrade $jax_pin-e $REMOTE_REPO'[tpu]'"
check="bash $REMOTE_REPO/launch/worker.sh check"
tpu_ssh all "set -e; $fetch && $install && $check"
log "Next: launch/prepare_data.sh --name $NAME --zone $ZONE --dataset DATASET --bucket gs://BUCKET/tfds"
