# shellcheck shell=bash
# Shared functions for the launch/*.sh scripts; sourced, never run directly.
#
# Every script that talks to Cloud goes through `run`, so `--dry-run` (or
# DRY_RUN=1 in the environment) prints the exact command lines, one per line
# on stdout, quoted so that they can be pasted into a shell, and executes
# nothing.  Progress messages go to stderr, so stdout of a dry run holds only
# the commands.
#
# Written for bash 3.2 and later (the bash of macOS): no associative arrays,
# and empty arrays are expanded as ${a[@]+"${a[@]}"} because `set -u` rejects
# "${a[@]}" for an empty array before bash 4.4.

# Where the repository is on this machine, and where setup.sh puts it on every
# TPU worker.  REMOTE_REPO is written into remote command strings unquoted,
# so that the worker's shell expands the ~.
# (SC2034: used by the scripts that source this file; SC2088: the ~ is meant
# for the worker's shell.)
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034
REPO_DIR=$(dirname "$LAUNCH_DIR")
# shellcheck disable=SC2034,SC2088
REMOTE_REPO='~/transformer_xl'


DRY_RUN=${DRY_RUN:-0}
# Options shared by every script that addresses a TPU; environment defaults.
NAME=${TPU_NAME:-}
ZONE=${ZONE:-}
PROJECT=${PROJECT:-}

SCRIPT_NAME=$(basename "$0")

# log MESSAGE...: a progress message on stderr.
log() {
  echo "[$SCRIPT_NAME] $*" >&2
}

# die MESSAGE...: an error on stderr, a pointer to --help, exit status 2.
die() {
  echo "$SCRIPT_NAME: error: $*" >&2
  echo "Run '$0 --help' for usage." >&2
  exit 2
}

# shell_quote WORD: WORD quoted for a POSIX shell, exactly as Python's
# shlex.quote does it (left alone if it only has safe characters, otherwise
# in single quotes, with each ' written as '"'"').
shell_quote() {
  local LC_ALL=C
  local word=$1 unsafe='[^A-Za-z0-9_@%+=:,./-]' quote="'\"'\"'"
  if [[ -z $word ]]; then
    printf "''"
  elif [[ $word =~ $unsafe ]]; then
    printf "'%s'" "${word//\'/$quote}"
  else
    printf '%s' "$word"
  fi
}

# shell_join WORD...: the words quoted and joined by spaces (shlex.join).
shell_join() {
  local sep=""
  while (($#)); do
    printf '%s' "$sep"
    shell_quote "$1"
    sep=" "
    shift
  done
}

is_dry_run() {
  [[ $DRY_RUN == 1 || $DRY_RUN == true ]]
}

# run COMMAND ARG...: in dry-run mode print the command line on stdout;
# otherwise echo it to stderr and execute it.
run() {
  if is_dry_run; then
    shell_join "$@"
    echo
  else
    log "+ $(shell_join "$@")"
    "$@"
  fi
}

# normalize_args ARG...: sets the array ARGS to the arguments with every
# "--option=value" split into "--option" "value", so the scripts' parsers
# handle both spellings.  Two kinds of argument are kept whole: --config.*
# overrides (passed through to transformer_xl.main) and everything after "--".
normalize_args() {
  ARGS=()
  local arg
  while (($#)); do
    arg=$1
    shift
    if [[ $arg == -- ]]; then
      ARGS+=(-- "$@")
      break
    elif [[ $arg == --config.* ]]; then
      ARGS+=("$arg")
    elif [[ $arg == --*=* ]]; then
      ARGS+=("${arg%%=*}" "${arg#*=}")
    else
      ARGS+=("$arg")
    fi
  done
}

# need_value OPTION [VALUE...]: fails unless OPTION is followed by a value.
need_value() {
  if (($# < 2)) || [[ -z $2 || $2 == --* ]]; then
    die "$1 needs a value."
  fi
}

# parse_common_option ARG...: handles the options every script shares.
# Returns 1 if $1 is not one of them; otherwise sets SHIFT_BY to the number of
# arguments consumed.  Scripts define `usage` before calling it.
# shellcheck disable=SC2034  # SHIFT_BY is read by the caller
parse_common_option() {
  SHIFT_BY=1
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    --dry-run) DRY_RUN=1 ;;
    --name) need_value "$@"; NAME=$2; SHIFT_BY=2 ;;
    --zone) need_value "$@"; ZONE=$2; SHIFT_BY=2 ;;
    --project) need_value "$@"; PROJECT=$2; SHIFT_BY=2 ;;
    *) return 1 ;;
  esac
}

# require VALUE OPTION [HINT]: fails with a clear message when VALUE is empty.
require() {
  if [[ -z $1 ]]; then
    die "missing required option $2${3:+ ($3)}."
  fi
}

# require_tpu: --name and --zone, which every gcloud tpu command needs.
require_tpu() {
  require "$NAME" --name "the TPU / queued-resource name, or set TPU_NAME"
  require "$ZONE" --zone "e.g. europe-west4-a, or set ZONE"
}

# Sets the array PROJECT_FLAG to (--project=...) when --project was given.
set_project_flag() {
  PROJECT_FLAG=()
  if [[ -n $PROJECT ]]; then
    PROJECT_FLAG=("--project=$PROJECT")
  fi
}

# tpu_ssh WORKER COMMAND: runs the shell command string COMMAND on TPU worker
# WORKER ("all" for every worker of the slice, in parallel, or an index).
tpu_ssh() {
  set_project_flag
  run gcloud compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" \
    ${PROJECT_FLAG[@]+"${PROJECT_FLAG[@]}"} "--worker=$1" "--command=$2"
}

# known_datasets: prints the corpus names that this checkout's
# transformer_xl.data.load_corpus accepts (its CORPUS_NAMES), read from
# the source with Python's ast module (nothing imported); prints nothing if
# python3 is missing or the source cannot be read.
known_datasets() {
  python3 - "$REPO_DIR/transformer_xl/data/__init__.py" 2>/dev/null <<'PY' || true
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CORPUS_NAMES" for t in node.targets):
        print(" ".join(ast.literal_eval(node.value)))
PY
}

# check_dataset NAME: fails unless NAME is a corpus that load_corpus knows
# (only its form is checked if the list cannot be read; the worker then
# reports an unknown name).
check_dataset() {
  local known names
  if [[ ! $1 =~ ^[a-z0-9_]+$ ]]; then
    die "'$1' is not a dataset name (lower case letters, digits and _)."
  fi
  names=$(known_datasets)
  if [[ -z $names ]]; then
    return 0
  fi
  for known in $names; do
    if [[ $1 == "$known" ]]; then
      return 0
    fi
  done
  die "unknown dataset '$1'; choose one of: $names."
}

# check_gcs_path VALUE OPTION: fails unless VALUE is a gs://bucket/path URL.
check_gcs_path() {
  if [[ ! $1 =~ ^gs://[^/]+ ]]; then
    die "$2 must be a Cloud Storage path gs://BUCKET/PATH (got '$1')."
  fi
}
