"""Tests of the Cloud TPU launch scripts (launch/*.sh) without Cloud.

Every script is run in dry-run mode and the command lines it prints are
compared with the exact gcloud command lines expected.  A fake ``gcloud``
(and ``gsutil``) that fails loudly and leaves a marker file is first on PATH,
so a test also proves that a dry run executes nothing.  The restart loop that
runs on the workers (launch/worker.sh) is exercised for real with local
commands.  Finally every script must pass shellcheck.
"""

import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tooling: the launch scripts

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
SCRIPTS = sorted(LAUNCH.glob("*.sh"))
ENTRY_POINTS = ["create", "setup", "prepare_data", "train", "logs", "stop", "delete", "worker"]
TPU = ["--name", "txl-pod", "--zone", "europe-west4-a"]
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "txl-pod", "--zone=europe-west4-a"]

FAKE_GCLOUD = """#!/bin/sh
echo "FAKE $(basename "$0") CALLED: $*" >&2
echo "$(basename "$0") $*" >> "$GCLOUD_MARKER"
exit 97
"""

# A gcloud that records its arguments (one JSON-free line: shlex-quoted) and succeeds.
RECORDING_GCLOUD = """#!/usr/bin/env python3
import os, shlex, sys
with open(os.environ["GCLOUD_MARKER"], "a") as f:
    f.write(shlex.join(sys.argv[1:]) + "\\n")
"""


def _write_exe(path: Path, text: str):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def cloud(tmp_path):
  """Environment with a loudly failing fake gcloud/gsutil first on PATH."""
  bin_dir = tmp_path / "fakebin"
  bin_dir.mkdir()
  for tool in ("gcloud", "gsutil"):
    _write_exe(bin_dir / tool, FAKE_GCLOUD)
  marker = tmp_path / "gcloud_called"
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ("TPU_NAME", "ZONE", "PROJECT", "DRY_RUN", "TFDS_DATA_DIR")
  }
  env.update(
      PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
      GCLOUD_MARKER=str(marker),
      TMPDIR=str(tmp_path),
      HOME=str(tmp_path / "home"),
  )
  (tmp_path / "home").mkdir()

  class Cloud:
    pass

  c = Cloud()
  c.env, c.marker, c.bin_dir, c.tmp = env, marker, bin_dir, tmp_path

  def script(name, *args, env_extra=None, timeout=60):
    return subprocess.run(
        ["bash", str(LAUNCH / f"{name}.sh"), *args],
        cwd=REPO,
        env={**env, **(env_extra or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )

  def dry(name, *args, env_extra=None):
    """Runs a script with --dry-run; returns its stdout lines (the commands)."""
    r = script(name, "--dry-run", *args, env_extra=env_extra)
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), f"a dry run executed: {marker.read_text()}"
    return r.stdout.splitlines()

  c.script, c.dry = script, dry
  return c


def line(*argv):
  """The printed form of a command: shell-quoted words (what a shell re-reads)."""
  return shlex.join(argv)


def remote_command(printed_ssh_line: str) -> str:
  """The --command=... of a printed `gcloud compute tpus tpu-vm ssh` line."""
  words = shlex.split(printed_ssh_line)
  (command,) = [w for w in words if w.startswith("--command=")]
  return command[len("--command=") :]


# ---------------------------------------------------------------- create.sh


def test_create_on_demand(cloud):
  assert cloud.dry("create", *TPU, "--accelerator-type", "v3-32") == [
      line(
          "gcloud",
          "compute",
          "tpus",
          "tpu-vm",
          "create",
          "txl-pod",
          "--zone=europe-west4-a",
          "--accelerator-type=v3-32",
          "--version=tpu-ubuntu2204-base",
      )
  ]


def test_create_spot_uses_queued_resources(cloud):
  assert cloud.dry(
      "create", *TPU, "--accelerator-type=v3-64", "--spot", "--project", "my-project"
  ) == [
      line(
          "gcloud",
          "compute",
          "tpus",
          "queued-resources",
          "create",
          "txl-pod",
          "--node-id=txl-pod",
          "--zone=europe-west4-a",
          "--project=my-project",
          "--accelerator-type=v3-64",
          "--runtime-version=tpu-ubuntu2204-base",
          "--spot",
      )
  ]


# A stand-in for python3 -m transformer_xl.compile: what the TPU compiler would print.
FAKE_COMPILE = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$COMPILE_ARGS"
echo "train: 64 rows (all devices) x 768 tokens per step"
echo "  memory per device: arguments 1 + outputs 1 - aliased 1 + temporaries 40 + code 0 = $GIB GiB of 16 GiB: $VERDICT"
[ "$VERDICT" = "DOES NOT FIT" ] && echo "  what makes it fit: --config.model.attn_block=128 (14.20 GiB)"
exit $STATUS
"""


@pytest.mark.parametrize("status,verdict", [(0, "FITS"), (3, "DOES NOT FIT"), (1, "")])
def test_create_compiles_the_config_first_and_refuses_one_that_does_not_fit(cloud, status, verdict):
  fake = cloud.bin_dir / "fake_python"
  _write_exe(fake, FAKE_COMPILE)
  args_file = cloud.tmp / "compile_args"
  env = {
      "PYTHON": str(fake),
      "COMPILE_ARGS": str(args_file),
      "STATUS": str(status),
      "VERDICT": verdict,
      "GIB": "41.57",
  }
  if status == 1:
    fake.write_text("#!/usr/bin/env bash\necho 'error: --topology=v5e-16: bad'\nexit 1\n")
  r = cloud.script(
      "create",
      "--dry-run",
      *TPU,
      "--accelerator-type=v5litepod-16",
      "--config=configs/enwik8_24l.py:v3-32",
      env_extra=env,
  )
  if status == 0:
    assert r.returncode == 0, r.stderr
    assert "--accelerator-type=v5litepod-16" in r.stdout  # the create command follows
    assert (
        "-m transformer_xl.compile --config=configs/enwik8_24l.py:v3-32 --topology=v5litepod-16"
        in (args_file.read_text())
    )
  else:
    assert r.returncode != 0 and "gcloud" not in r.stdout, r.stdout
    assert "nothing created" in r.stderr and "Traceback" not in r.stderr
    if status == 3:
      assert "does not fit a v5litepod-16 (= 41.57 GiB of 16 GiB: DOES NOT FIT)" in r.stderr
      assert "--config.model.attn_block=128" in r.stderr  # the setting that fits
    else:
      assert "error: --topology=v5e-16: bad" in r.stderr
  assert not cloud.marker.exists()


@pytest.mark.parametrize(
    "accelerator,version",
    [
        ("v2-8", "tpu-ubuntu2204-base"),
        ("v4-32", "tpu-ubuntu2204-base"),
        ("v5litepod-32", "v2-alpha-tpuv5-lite"),
        ("v5p-64", "v2-alpha-tpuv5"),
        ("v6e-16", "v2-alpha-tpuv6e"),
    ],
)
def test_create_default_runtime_version(cloud, accelerator, version):
  (printed,) = cloud.dry("create", *TPU, "--accelerator-type", accelerator)
  assert printed.endswith(f"--accelerator-type={accelerator} --version={version}")


def test_create_explicit_version_and_env_defaults(cloud):
  # TPU_NAME / ZONE from the environment, DRY_RUN=1 instead of --dry-run.
  r = cloud.script(
      "create",
      "--accelerator-type",
      "v3-8",
      "--version",
      "tpu-vm-base",
      env_extra={"TPU_NAME": "from-env", "ZONE": "us-central1-a", "DRY_RUN": "1"},
  )
  assert r.returncode == 0, r.stderr
  assert not cloud.marker.exists()
  assert r.stdout.splitlines() == [
      line(
          "gcloud",
          "compute",
          "tpus",
          "tpu-vm",
          "create",
          "from-env",
          "--zone=us-central1-a",
          "--accelerator-type=v3-8",
          "--version=tpu-vm-base",
      )
  ]


# ----------------------------------------------------------------- setup.sh


def test_setup_copies_this_checkout(cloud):
  archive = str(cloud.tmp / "transformer_xl-src.tar.gz")
  assert cloud.dry("setup", *TPU) == [
      line(
          "tar",
          "-czf",
          archive,
          "-C",
          str(REPO),
          "--exclude=./.git",
          "--exclude=./workdirs",
          "--exclude=__pycache__",
          "--exclude=.pytest_cache",
          "--exclude=*.egg-info",
          ".",
      ),
      line(
          "gcloud",
          "compute",
          "tpus",
          "tpu-vm",
          "scp",
          archive,
          "txl-pod:transformer_xl-src.tar.gz",
          "--zone=europe-west4-a",
          "--worker=all",
      ),
      line(
          *SSH,
          "--worker=all",
          "--command=set -e; rm -rf ~/transformer_xl && mkdir -p ~/transformer_xl"
          " && tar -xzf ~/transformer_xl-src.tar.gz -C ~/transformer_xl"
          " && python3 -m pip install --upgrade -e ~/transformer_xl'[tpu]'"
          " && bash ~/transformer_xl/launch/worker.sh check",
      ),
  ]
  assert not Path(archive).exists()  # the tar was printed, not run


def test_setup_clones_a_repository(cloud):
  assert cloud.dry(
      "setup",
      *TPU,
      "--repo-url",
      "https://github.com/someone/transformer_xl.git",
      "--ref",
      "v0.1",
      "--jax-spec",
      "jax[tpu]==0.10.2",
  ) == [
      line(
          *SSH,
          "--worker=all",
          "--command=set -e; rm -rf ~/transformer_xl && git clone --depth 1 --branch v0.1"
          " https://github.com/someone/transformer_xl.git ~/transformer_xl"
          " && python3 -m pip install --upgrade 'jax[tpu]==0.10.2' -e ~/transformer_xl'[tpu]'"
          " && bash ~/transformer_xl/launch/worker.sh check",
      )
  ]


# ---------------------------------------------------------- prepare_data.sh


def test_prepare_data_on_worker_0_then_to_bucket(cloud):
  (printed,) = cloud.dry(
      "prepare_data", *TPU, "--dataset", "enwik8", "--bucket", "gs://my-bucket/tfds/"
  )
  assert printed == line(
      *SSH,
      "--worker=0",
      "--command=set -e; cd ~/transformer_xl && python3 -c 'import os; from transformer_xl import"
      ' data; corpus = data.load_corpus("enwik8", data_dir=os.path.expanduser('
      '"~/tensorflow_datasets"), manual_dir=None); print({name: split.num_tokens for name, split'
      " in corpus.splits.items()}, flush=True)' && gcloud storage rsync --recursive"
      " ~/tensorflow_datasets/txl_enwik8 gs://my-bucket/tfds/txl_enwik8",
  )


def test_prepare_data_from_manual_files_in_a_bucket(cloud):
  (printed,) = cloud.dry(
      "prepare_data",
      *TPU,
      "--dataset",
      "wikitext103",
      "--bucket",
      "gs://b/tfds",
      "--manual-from",
      "gs://b/raw/wt103",
      "--worker",
      "1",
  )
  assert "--worker=1" in shlex.split(printed)
  command = remote_command(printed)
  assert command.startswith(
      "set -e; cd ~/transformer_xl && mkdir -p ~/txl_manual/wikitext103"
      " && gcloud storage rsync --recursive gs://b/raw/wt103"
      " ~/txl_manual/wikitext103 && python3 -c "
  )
  assert 'manual_dir=os.path.expanduser("~/txl_manual/wikitext103")' in command
  assert command.endswith(
      "gcloud storage rsync --recursive ~/tensorflow_datasets/txl_wikitext103"
      " gs://b/tfds/txl_wikitext103"
  )


def test_prepare_data_knows_every_corpus_and_its_tfds_name(cloud):
  """The names come from the checkout's CORPUS_NAMES; the tfds dir is the builder's name."""
  from transformer_xl import data
  from transformer_xl.data import builders

  for name in data.CORPUS_NAMES:
    (printed,) = cloud.dry("prepare_data", *TPU, "--dataset", name, "--bucket", "gs://b/tfds")
    builder = builders.BUILDERS[name].name
    assert remote_command(printed).endswith(
        f" ~/tensorflow_datasets/{builder} gs://b/tfds/{builder}"
    ), printed


# ----------------------------------------------------------------- train.sh


def test_train_on_all_workers_with_overrides(cloud):
  (printed,) = cloud.dry(
      "train",
      *TPU,
      "--config",
      "configs/enwik8_24l.py",
      "--workdir",
      "gs://my-bucket/enwik8_24l",
      "--config.mesh.shape=(32, 1, 1)",
      "--config.model.dtype=bfloat16",
      "--",
      "--config.model.remat=full",
  )
  assert printed == line(
      *SSH,
      "--worker=all",
      "--command=cd ~/transformer_xl && bash launch/worker.sh start -- python3 -m"
      " transformer_xl.main --config=configs/enwik8_24l.py --workdir=gs://my-bucket/enwik8_24l"
      " --mode=train '--config.mesh.shape=(32, 1, 1)' --config.model.dtype=bfloat16"
      " --config.model.remat=full",
  )
  # What the worker's shell makes of it: the overrides arrive as single words.
  assert shlex.split(remote_command(printed))[3:] == [
      "bash",
      "launch/worker.sh",
      "start",
      "--",
      "python3",
      "-m",
      "transformer_xl.main",
      "--config=configs/enwik8_24l.py",
      "--workdir=gs://my-bucket/enwik8_24l",
      "--mode=train",
      "--config.mesh.shape=(32, 1, 1)",
      "--config.model.dtype=bfloat16",
      "--config.model.remat=full",
  ]


def test_train_with_a_slice_preset(cloud):
  (printed,) = cloud.dry(
      "train", *TPU, "--config", "configs/enwik8_24l.py:v3-32", "--workdir", "gs://b/enwik8_24l"
  )
  assert printed == line(
      *SSH,
      "--worker=all",
      "--command=cd ~/transformer_xl && bash launch/worker.sh start -- python3 -m"
      " transformer_xl.main --config=configs/enwik8_24l.py:v3-32 --workdir=gs://b/enwik8_24l"
      " --mode=train",
  )


def test_train_eval_mode_with_data_and_restart_options(cloud):
  (printed,) = cloud.dry(
      "train",
      *TPU,
      "--project=p",
      "--config=configs/text8_24l.py",
      "--workdir=gs://b/t8",
      "--mode",
      "eval",
      "--data",
      "gs://b/tfds/txl_text8",
      "--max-restarts",
      "3",
      "--restart-delay",
      "5",
  )
  assert printed == line(
      *SSH,
      "--project=p",
      "--worker=all",
      "--command=cd ~/transformer_xl && bash launch/worker.sh start --max-restarts 3"
      " --restart-delay 5 --data gs://b/tfds/txl_text8 -- python3 -m transformer_xl.main"
      " --config=configs/text8_24l.py --workdir=gs://b/t8 --mode=eval",
  )


# ------------------------------------------------------ logs, stop, delete


def test_logs_streams_worker_0(cloud):
  assert cloud.dry("logs", *TPU) == [
      line(*SSH, "--worker=0", "--command=tail -n 100 -F ~/txl_run/run.log")
  ]
  assert cloud.dry("logs", *TPU, "--worker", "3", "--lines", "20", "--no-follow") == [
      line(*SSH, "--worker=3", "--command=tail -n 20 ~/txl_run/run.log")
  ]


def test_stop_signals_every_worker(cloud):
  assert cloud.dry("stop", *TPU, "--timeout", "300") == [
      line(
          *SSH,
          "--worker=all",
          "--command=cd ~/transformer_xl && bash launch/worker.sh stop --timeout 300",
      )
  ]


def test_delete(cloud):
  assert cloud.dry("delete", *TPU) == [
      line("gcloud", "compute", "tpus", "tpu-vm", "delete", "txl-pod", "--zone=europe-west4-a")
  ]
  assert cloud.dry("delete", *TPU, "--spot", "--yes") == [
      line(
          "gcloud",
          "compute",
          "tpus",
          "queued-resources",
          "delete",
          "txl-pod",
          "--zone=europe-west4-a",
          "--force",
          "--quiet",
      )
  ]


def test_without_dry_run_the_printed_command_is_what_runs(cloud):
  """Outside dry-run, `run` executes exactly the argv that a dry run prints."""
  _write_exe(cloud.bin_dir / "gcloud", RECORDING_GCLOUD)
  cases = [
      ("create", *TPU, "--accelerator-type", "v3-32", "--spot"),
      (
          "train",
          *TPU,
          "--config",
          "configs/enwik8_12l.py",
          "--workdir",
          "gs://b/w",
          "--config.mesh.shape=(2, 1, 1)",
      ),
      ("delete", *TPU, "--yes"),
  ]
  for name, *args in cases:
    printed = cloud.dry(name, *args)
    r = cloud.script(name, *args)
    assert r.returncode == 0, r.stderr
    assert cloud.marker.read_text().splitlines() == [p.split(" ", 1)[1] for p in printed]
    cloud.marker.unlink()


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "name,args,message",
    [
        (
            "create",
            ["--zone", "z", "--accelerator-type", "v3-32"],
            "missing required option --name",
        ),
        (
            "create",
            ["--name", "n", "--accelerator-type", "v3-32"],
            "missing required option --zone",
        ),
        ("create", [*TPU], "missing required option --accelerator-type"),
        ("create", [*TPU, "--accelerator-type", "v9-8"], "no default --version"),
        ("create", [*TPU, "--accelerator-type"], "--accelerator-type needs a value"),
        ("setup", ["--zone", "z"], "missing required option --name"),
        ("setup", [*TPU, "--ref", "main"], "--ref needs --repo-url"),
        ("prepare_data", [*TPU, "--bucket", "gs://b/tfds"], "missing required option --dataset"),
        ("prepare_data", [*TPU, "--dataset", "ptb"], "missing required option --bucket"),
        (
            "prepare_data",
            [*TPU, "--dataset", "wikitext5", "--bucket", "gs://b"],
            "unknown dataset 'wikitext5'; choose one of: enwik8 text8 ptb",
        ),
        (
            "prepare_data",
            [*TPU, "--dataset", "ptb", "--bucket", "/tmp/x"],
            "must be a Cloud Storage",
        ),
        ("train", [*TPU, "--workdir", "gs://b/w"], "missing required option --config"),
        ("train", [*TPU, "--config", "configs/ptb.py"], "missing required option --workdir"),
        (
            "train",
            [*TPU, "--config", "configs/ptb.py", "--workdir", "/tmp/w"],
            "--workdir must be a Cloud Storage path",
        ),
        (
            "train",
            [*TPU, "--config", "configs/nope.py", "--workdir", "gs://b/w"],
            "--config configs/nope.py",
        ),
        (
            "train",
            [*TPU, "--config", "configs/ptb.py", "--workdir", "gs://b/w", "--mode", "test"],
            "--mode must be train or eval",
        ),
        (
            "train",
            [*TPU, "--config", "configs/ptb.py", "--workdir", "gs://b/w", "--model.x=1"],
            "unknown argument '--model.x'",
        ),
        ("logs", ["--name", "n"], "missing required option --zone"),
        ("logs", [*TPU, "--worker", "all"], "--worker must be one worker's index"),
        ("stop", ["--zone", "z"], "missing required option --name"),
        ("delete", ["--name", "n"], "missing required option --zone"),
        ("delete", [*TPU, "--force"], "unknown argument '--force'"),
        ("worker", ["start"], "start needs the training command after --"),
        ("worker", ["launch"], "unknown command 'launch'"),
    ],
)
def test_bad_arguments_fail_with_a_message_and_run_nothing(cloud, name, args, message):
  for extra in ([], ["--dry-run"]):
    r = cloud.script(name, *args, *extra)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "--help" in r.stderr
    assert not cloud.marker.exists()


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help(cloud, name):
  r = cloud.script(name, "--help")
  assert r.returncode == 0 and r.stdout.startswith("Usage: launch/"), r.stderr
  assert not cloud.marker.exists()


# ------------------------------------------------- worker.sh, for real


def test_worker_loop_restarts_a_failed_run_until_it_succeeds(cloud, tmp_path):
  counter = tmp_path / "attempts"
  flaky = tmp_path / "flaky.sh"  # fails twice, then succeeds
  _write_exe(flaky, f'#!/bin/sh\necho x >> "{counter}"\n[ "$(wc -l < "{counter}")" -ge 3 ]\n')
  run_dir = tmp_path / "run"
  r = cloud.script(
      "worker", "loop", "--run-dir", str(run_dir), "--restart-delay", "0", "--", str(flaky)
  )
  assert r.returncode == 0, r.stdout + r.stderr
  assert len(counter.read_text().splitlines()) == 3
  assert r.stdout.count("restart ") == 2 and "finished (exit status 0)" in r.stdout
  assert not (run_dir / "loop.pid").exists()


def test_worker_loop_gives_up_after_max_restarts(cloud, tmp_path):
  r = cloud.script(
      "worker",
      "loop",
      "--run-dir",
      str(tmp_path / "run"),
      "--restart-delay",
      "0",
      "--max-restarts",
      "2",
      "--",
      "sh",
      "-c",
      "exit 3",
  )
  assert r.returncode == 3
  assert r.stdout.count("attempt ") == 3 and "giving up after 2 restarts" in r.stdout


def test_worker_loop_syncs_the_dataset_before_each_attempt(cloud, tmp_path):
  _write_exe(cloud.bin_dir / "gcloud", RECORDING_GCLOUD)
  data_dir = tmp_path / "tfds"
  r = cloud.script(
      "worker",
      "loop",
      "--run-dir",
      str(tmp_path / "run"),
      "--data",
      "gs://b/tfds/txl_ptb/",
      "--data-dir",
      str(data_dir),
      "--",
      "true",
  )
  assert r.returncode == 0, r.stdout + r.stderr
  assert cloud.marker.read_text().splitlines() == [
      line("storage", "rsync", "--recursive", "gs://b/tfds/txl_ptb/", str(data_dir / "txl_ptb"))
  ]


TRAINER = """
import signal, sys, time
def on_term(*_):
    print("SIGTERM: checkpointing", flush=True)
    time.sleep(0.5)
    print("checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
while True:
    time.sleep(0.05)
"""


def _wait_for(predicate, timeout=20.0):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    time.sleep(0.05)
  return False


def test_worker_start_detaches_and_stop_checkpoints_without_restart(cloud, tmp_path):
  trainer = tmp_path / "trainer.py"
  trainer.write_text(TRAINER)
  run_dir = tmp_path / "run"
  args = ["--run-dir", str(run_dir), "--restart-delay", "0"]
  r = cloud.script("worker", "start", *args, "--", "python3", str(trainer))
  assert r.returncode == 0, r.stderr
  log = run_dir / "run.log"
  loop_pid = int((run_dir / "loop.pid").read_text())
  try:
    assert _wait_for(lambda: "training" in log.read_text())
    again = cloud.script("worker", "start", *args, "--", "python3", str(trainer))
    assert again.returncode != 0 and "already active" in again.stderr
    assert f"running: loop pid {loop_pid}" in cloud.script("worker", "status", *args).stdout
    assert cloud.script("worker", "stop", "--dry-run", *args).stdout == f"kill -TERM {loop_pid}\n"
    r = cloud.script("worker", "stop", *args)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
  finally:
    if Path(f"/proc/{loop_pid}").exists():
      os.kill(loop_pid, signal.SIGKILL)
  text = log.read_text()
  assert "checkpoint written" in text
  assert "stopped; the training process exited with status 0" in text
  assert text.count("attempt ") == 1  # not restarted
  assert not (run_dir / "loop.pid").exists()


def test_worker_loop_on_preemption_signals_does_not_restart(cloud, tmp_path):
  """A VM shutting down sends SIGTERM to every process at once."""
  trainer = tmp_path / "trainer.py"
  trainer.write_text(TRAINER)
  run_dir = tmp_path / "run"
  proc = subprocess.Popen(
      [
          "bash",
          str(LAUNCH / "worker.sh"),
          "loop",
          "--run-dir",
          str(run_dir),
          "--restart-delay",
          "0",
          "--",
          "python3",
          str(trainer),
      ],
      env=cloud.env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
  )
  try:
    assert _wait_for(lambda: (run_dir / "child.pid").exists())
    child = int((run_dir / "child.pid").read_text())
    time.sleep(0.5)  # let python install its handler
    os.kill(child, signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, out
  assert "checkpoint written" in out and out.count("attempt ") == 1


# ---------------------------------------------------------------- static


def test_scripts_are_strict_bash_with_help():
  names = {p.stem for p in SCRIPTS}
  assert set(ENTRY_POINTS) | {"common"} == names
  for path in SCRIPTS:
    text = path.read_text()
    if path.stem == "common":
      assert text.startswith("# shellcheck shell=bash\n")  # sourced, never run
      continue
    assert text.startswith("#!/usr/bin/env bash\n"), path
    assert "set -euo pipefail" in text and "usage()" in text, path
    assert os.access(path, os.X_OK), f"{path} is not executable"


def test_shellcheck_passes_on_every_script():
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.fail(
        "shellcheck is not installed: apt-get install -y shellcheck "
        "(this test checks every launch/*.sh with it)."
    )
  r = subprocess.run(
      [shellcheck, "--external-sources", *map(str, SCRIPTS)],
      cwd=REPO,
      capture_output=True,
      text=True,
  )
  assert r.returncode == 0, r.stdout + r.stderr
