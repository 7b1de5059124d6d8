"""Workdirs written by the code before the memory variants owned their settings.

Until commit 3ea4d5c (2026-11-26) the memory variants' settings were flat
keys of the model section (``model.cmem_len``, ``model.num_mem_tokens``,
...) and of the eval section (``eval.cmem_len``), in ``config.json``,
``model_config.json`` and every checkpoint's record.  This script, run from
a checkout of that commit, trains two tiny models on the synthetic copy
task with those flags (a compressive memory with conv compression; memory
tokens with the XL cache and ``read_mem_from_cache``), each to step 2 with
a checkpoint at steps 1 and 2, evaluates them, and trains a copy of each to
step 3: ``tests/fixtures/legacy_workdirs/<name>/`` (the step-2 workdir: its
configs, checkpoints and ``eval_results.json``) and ``<name>_step3/``
(the step-3 checkpoint alone).  ``tests/test_memory_conformance.py`` loads
them with today's code: the eval results and the parameters after resuming
to step 3 must equal what this code computed.

    git worktree add /tmp/old 3ea4d5c
    cd /tmp/old && python /path/to/scripts/make_legacy_workdirs.py --out /path/to/tests/fixtures/legacy_workdirs

One device (no simulated devices), float32, XLA's backend optimisation
off (``--xla_backend_optimization_level=0``, as the test suite compiles and
as tests/fixtures/memory_bitwise.npz was written: the tests compare bit for
bit where the machine is the same).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

COMMON = [
    "--config=configs/copy_rmt.py:xl",
    "--config.data.synthetic_seq_len=4",
    "--config.data.synthetic_num_tokens=7",
    "--config.data.synthetic_train_size=64",
    "--config.data.synthetic_valid_size=8",
    "--config.data.synthetic_test_size=8",
    "--config.model.n_layer=2",
    "--config.model.d_model=16",
    "--config.model.n_head=2",
    "--config.model.d_head=8",
    "--config.model.d_inner=32",
    "--config.model.dropout=0.1",
    "--config.train.global_batch=4",
    "--config.train.learning_rate=0.01",
    "--config.train.log_every=1",
    "--config.train.eval_every=0",
    "--config.train.seed=3",
    "--config.eval.global_batch=4",
    "--config.checkpoint.every_steps=1",
    "--config.checkpoint.max_to_keep=5",
]

WORKDIRS = {
    "compressive": [
        "--config.model.tgt_len=4",
        "--config.model.mem_len=4",
        "--config.model.memory=compressive",
        "--config.model.cmem_len=4",
        "--config.model.cmem_ratio=2",
        "--config.model.cmem_fn=conv",
        "--config.eval.tgt_len=4",
        "--config.eval.mem_len=4",
        "--config.eval.cmem_len=6",
    ],
    "tokens": [
        "--config.model.tgt_len=4",
        "--config.model.mem_len=4",
        "--config.model.num_mem_tokens=2",
        "--config.model.read_mem_from_cache=True",
        "--config.eval.tgt_len=4",
        "--config.eval.mem_len=4",
    ],
}


def run(*args: str) -> None:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0")
  r = subprocess.run(
      [sys.executable, "-m", "transformer_xl.main", *args], env=env, capture_output=True, text=True
  )
  if r.returncode:
    sys.exit(r.stderr[-3000:])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  out = Path(parser.parse_args().out).absolute()
  for name, flags in WORKDIRS.items():
    workdir, step3 = out / name, out / f"{name}_step3"
    for d in (workdir, step3):
      shutil.rmtree(d, ignore_errors=True)
    run(*COMMON, *flags, f"--workdir={workdir}", "--config.train.num_steps=2")
    run(f"--workdir={workdir}", "--mode=eval")
    shutil.copytree(workdir, step3)
    run(*COMMON, *flags, f"--workdir={step3}", "--config.train.num_steps=3")
    for d in (workdir, step3):  # what the test does not read
      shutil.rmtree(d / "tensorboard", ignore_errors=True)
    for p in step3.iterdir():  # the step-3 checkpoint only
      if p.name != "checkpoints":
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for p in (step3 / "checkpoints").iterdir():
      if p.name != "3":
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    print(name, "written", flush=True)


if __name__ == "__main__":
  main()
