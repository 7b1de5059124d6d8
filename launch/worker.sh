#!/usr/bin/env bash
# Runs ON a TPU worker (setup.sh puts it in ~/transformer_xl/launch); train.sh,
# stop.sh and setup.sh call it over `gcloud compute tpus tpu-vm ssh`.
#
#   check   prints what JAX sees (joins the slice like transformer_xl.main).
#   start   starts `loop` in the background (setsid + nohup), detached from the
#           ssh session, appending to RUN_DIR/run.log; refuses if a run is
#           already active.
#   loop    runs the training command and restarts it when it fails, so that a
#           crashed or killed run resumes from its latest checkpoint.  On
#           SIGTERM/SIGINT (stop, or the VM shutting down) it passes SIGTERM
#           to the training process, which checkpoints and exits, and does not
#           restart it.
#   stop    sends SIGTERM to the loop and waits until training has exited.
#   status  whether a run is active, and the end of its log.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'EOF'
Usage: launch/worker.sh check
       launch/worker.sh start|loop [--run-dir DIR] [--data GS_DIR] [--data-dir DIR]
                                   [--max-restarts N] [--restart-delay SECONDS]
                                   [--dry-run] -- COMMAND [ARG...]
       launch/worker.sh stop [--run-dir DIR] [--timeout SECONDS] [--dry-run]
       launch/worker.sh status [--run-dir DIR] [--lines N]

Runs on a TPU worker; launch/train.sh and launch/stop.sh call it on every
worker.  See the comment at the top of this file for what each command does.

  --run-dir DIR          pid files and run.log (default: ~/txl_run).
  --data GS_DIR          before every attempt, sync this prepared tfds dataset
                         (gs://BUCKET/tfds/txl_NAME, see prepare_data.sh) into
                         --data-dir with `gcloud storage rsync`.
  --data-dir DIR         local tfds data dir (default: $TFDS_DATA_DIR or
                         ~/tensorflow_datasets, where transformer_xl looks).
  --max-restarts N       give up after N restarts in a row (default: 10); an
                         attempt that ran for an hour or more resets the count.
  --restart-delay SECONDS  pause before a restart (default: 60).
  --timeout SECONDS      stop: how long to wait for the checkpoint before
                         killing the processes (default: 900).
  --lines N              status: lines of the log to show (default: 20).
  --dry-run              print what would be run, run nothing (also DRY_RUN=1).
EOF
}

RUN_DIR="$HOME/txl_run"
DATA=""
DATA_DIR="${TFDS_DATA_DIR:-$HOME/tensorflow_datasets}"
MAX_RESTARTS=10
RESTART_DELAY=60
TIMEOUT=900
LINES=20
HEALTHY_AFTER=3600 # seconds; a longer attempt resets the restart count
COMMAND=()

# say MESSAGE...: a timestamped line on stdout (which is run.log for `loop`).
say() {
  echo "[worker.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname)] $*"
}

is_number() {
  [[ $1 =~ ^[0-9]+$ ]]
}

# loop_pid: prints the pid of the active loop; fails if none is active.
loop_pid() {
  local pid
  [[ -f $RUN_DIR/loop.pid ]] || return 1
  pid=$(cat "$RUN_DIR/loop.pid")
  is_number "$pid" && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# ---- loop ------------------------------------------------------------------

CHILD=""
SLEEPER=""
STOPPING=0
INTERRUPTED=0

# SIGTERM/SIGINT: no more restarts; the training process gets SIGTERM so that
# it writes a checkpoint and exits (transformer_xl.main's preemption handling).
on_signal() {
  STOPPING=1
  INTERRUPTED=1
  if [[ -n $SLEEPER ]]; then
    kill -TERM "$SLEEPER" 2>/dev/null || true
  fi
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
    say "stop requested: SIGTERM to pid $CHILD, waiting for it to checkpoint and exit"
    kill -TERM "$CHILD" 2>/dev/null || true
  fi
}

# run_child COMMAND...: runs COMMAND in the background and waits for it; sets
# CHILD_RC.  A trapped signal interrupts `wait` (after the trap has run), so
# wait again until the child's own exit status is in.
run_child() {
  "$@" &
  CHILD=$!
  echo "$CHILD" >"$RUN_DIR/child.pid"
  if ((STOPPING)); then # a signal that came before CHILD was known
    kill -TERM "$CHILD" 2>/dev/null || true
  fi
  while :; do
    INTERRUPTED=0
    if wait "$CHILD"; then CHILD_RC=0; else CHILD_RC=$?; fi
    if ((!INTERRUPTED)); then
      break
    fi
  done
  CHILD=""
  rm -f "$RUN_DIR/child.pid"
}

# sleep_interruptible SECONDS: a sleep that SIGTERM cuts short.
sleep_interruptible() {
  sleep "$1" &
  SLEEPER=$!
  wait "$SLEEPER" || true
  SLEEPER=""
}

cmd_loop() {
  local attempt=0 failures=0 started rc target
  mkdir -p "$RUN_DIR"
  echo "$$" >"$RUN_DIR/loop.pid"
  trap 'rm -f "$RUN_DIR/loop.pid" "$RUN_DIR/child.pid"' EXIT
  trap on_signal TERM INT
  while :; do
    attempt=$((attempt + 1))
    started=$SECONDS
    rc=0
    if [[ -n $DATA ]]; then
      target="$DATA_DIR/$(basename "${DATA%/}")"
      say "attempt $attempt: syncing $DATA to $target"
      mkdir -p "$target"
      run_child gcloud storage rsync --recursive "$DATA" "$target"
      rc=$CHILD_RC
    fi
    if ((rc == 0 && !STOPPING)); then
      say "attempt $attempt: $(shell_join "${COMMAND[@]}")"
      run_child "${COMMAND[@]}"
      rc=$CHILD_RC
    fi
    if ((STOPPING)); then
      say "stopped; the training process exited with status $rc"
      exit "$rc"
    fi
    if ((rc == 0)); then
      say "finished (exit status 0)"
      exit 0
    fi
    if ((SECONDS - started >= HEALTHY_AFTER)); then
      failures=0
    fi
    failures=$((failures + 1))
    if ((failures > MAX_RESTARTS)); then
      say "exit status $rc; giving up after $MAX_RESTARTS restarts in a row"
      exit "$rc"
    fi
    say "exit status $rc; restart $failures of at most $MAX_RESTARTS in ${RESTART_DELAY}s" \
      "(training resumes from the latest checkpoint)"
    sleep_interruptible "$RESTART_DELAY"
    if ((STOPPING)); then
      say "stopped while waiting to restart"
      exit "$rc"
    fi
  done
}

# ---- start / stop / status / check ----------------------------------------

# The options of `start` that `loop` needs, to pass them on.
loop_options() {
  LOOP_OPTIONS=(--run-dir "$RUN_DIR" --data-dir "$DATA_DIR" --max-restarts "$MAX_RESTARTS"
    --restart-delay "$RESTART_DELAY")
  if [[ -n $DATA ]]; then
    LOOP_OPTIONS+=(--data "$DATA")
  fi
}

cmd_start() {
  local pid launcher log_file="$RUN_DIR/run.log" waited=0
  if pid=$(loop_pid); then
    die "a run is already active on this worker (loop pid $pid, log $log_file); stop it first (launch/stop.sh)."
  fi
  loop_options
  launcher=(nohup bash "$LAUNCH_DIR/worker.sh" loop "${LOOP_OPTIONS[@]}" -- "${COMMAND[@]}")
  # Its own session: the loop outlives the ssh session that started it.
  if command -v setsid >/dev/null; then
    launcher=(setsid "${launcher[@]}")
  fi
  if is_dry_run; then
    echo "$(shell_join "${launcher[@]}") >> $(shell_quote "$log_file") 2>&1 < /dev/null &"
    return 0
  fi
  mkdir -p "$RUN_DIR"
  "${launcher[@]}" >>"$log_file" 2>&1 </dev/null &
  # The loop writes its pid file first thing; wait for it so that an
  # immediate stop finds the run.
  until pid=$(loop_pid); do
    if ((waited >= 50)); then
      die "the loop did not start; see $log_file."
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  say "started: loop pid $pid, log $log_file"
}

cmd_stop() {
  local pid child waited=0
  if ! pid=$(loop_pid); then
    say "no active run in $RUN_DIR"
    return 0
  fi
  run kill -TERM "$pid"
  if is_dry_run; then
    return 0
  fi
  say "sent SIGTERM to loop pid $pid; waiting up to ${TIMEOUT}s for the checkpoint"
  while kill -0 "$pid" 2>/dev/null; do
    if ((waited >= TIMEOUT)); then
      say "still running after ${TIMEOUT}s: killing it (progress since the last checkpoint is lost)"
      child=$(cat "$RUN_DIR/child.pid" 2>/dev/null || true)
      if is_number "$child"; then
        kill -KILL "$child" 2>/dev/null || true
      fi
      kill -KILL "$pid" 2>/dev/null || true
      rm -f "$RUN_DIR/loop.pid" "$RUN_DIR/child.pid"
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  say "stopped"
}

cmd_status() {
  local pid
  if pid=$(loop_pid); then
    say "running: loop pid $pid, training pid $(cat "$RUN_DIR/child.pid" 2>/dev/null || echo none)"
  else
    say "no active run in $RUN_DIR"
  fi
  if [[ -f $RUN_DIR/run.log ]]; then
    run tail -n "$LINES" "$RUN_DIR/run.log"
  fi
}

cmd_check() {
  local code
  code='from transformer_xl.cli import process_settings; process_settings.initialize_distributed(); '
  code+='import jax; print(f"process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local '
  code+='devices of {jax.device_count()}, {jax.devices()[0].device_kind}", flush=True)'
  run python3 -c "$code"
}

# ---- arguments ---------------------------------------------------------------

SUBCOMMAND=${1:-}
case $SUBCOMMAND in
  check | start | loop | stop | status) shift ;;
  -h | --help | "")
    usage
    [[ -n $SUBCOMMAND ]] && exit 0
    exit 2
    ;;
  *) die "unknown command '$SUBCOMMAND'; use check, start, loop, stop or status." ;;
esac

normalize_args "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
while (($#)); do
  case $1 in
    --run-dir) need_value "$@"; RUN_DIR=$2; shift 2 ;;
    --data) need_value "$@"; check_gcs_path "$2" --data; DATA=$2; shift 2 ;;
    --data-dir) need_value "$@"; DATA_DIR=$2; shift 2 ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS=$2; shift 2 ;;
    --restart-delay) need_value "$@"; RESTART_DELAY=$2; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT=$2; shift 2 ;;
    --lines) need_value "$@"; LINES=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; COMMAND=("$@"); break ;;
    *) die "unknown argument '$1' (the training command goes after --)." ;;
  esac
done
for value in "$MAX_RESTARTS" "$RESTART_DELAY" "$TIMEOUT" "$LINES"; do
  is_number "$value" || die "'$value' is not a whole number of restarts/seconds/lines."
done

case $SUBCOMMAND in
  check) cmd_check ;;
  start | loop)
    ((${#COMMAND[@]})) || die "$SUBCOMMAND needs the training command after --."
    "cmd_$SUBCOMMAND"
    ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
esac
