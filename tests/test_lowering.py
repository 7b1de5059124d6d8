"""Every paper config's steps lower for TPU and CUDA, on the meshes they target.

For each config on its slice preset (the reference's TPU slices: v3-32 for
enwik8 and text8, v3-64 for WikiText-103, v3-512 for One Billion Word) and on
one 8-GPU host, in bfloat16 and float32: the train step, the eval step and
both generation steps are built with abstract arguments
(``transformer_xl.training.lowering``) and exported with ``jax.export`` for
``platforms=("tpu",)`` and ``("cuda",)``, on as many simulated CPU devices as the mesh has.  A step that
stops lowering (a host callback, an op a backend lacks, a sharding the
partitioner rejects at lowering) fails here with the config's name, not on
a rented slice.  Nothing is compiled or run: XLA's TPU and GPU compilers
(memory per device, Mosaic's and Triton's code generation) are not
exercised.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_xl.training import lowering

pytestmark = pytest.mark.slow  # subprocesses with up to 512 simulated devices: minutes

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "lowering_worker.py"

PAPER = [
    "enwik8_12l",
    "enwik8_24l",
    "text8_24l",
    "wt103_base",
    "wt103_large",
    "lm1b_base",
    "lm1b_large",
    "ptb",
]
PRESETS = {
    "enwik8_24l": "v3-32",
    "text8_24l": "v3-32",
    "wt103_large": "v3-64",
    "lm1b_large": "v3-512",
}
DEVICES = {"v3-32": 32, "v3-64": 64, "v3-512": 512}


def jobs() -> list:
  """(device count, job strings) per worker process."""
  out = []
  gpu = [f"configs/{n}.py@gpu8@{d}@xla" for n in PAPER for d in ("bfloat16", "float32")]
  gpu.append("configs/enwik8_12l.py@gpu8@bfloat16@pallas")
  for k in range(4):
    out.append(pytest.param(8, gpu[k::4], id=f"gpu8-{k}"))
  for name, preset in PRESETS.items():
    part = [f"configs/{name}.py:{preset}@preset@{d}@xla" for d in ("bfloat16", "float32")]
    if name == "enwik8_24l":
      part.append(f"configs/{name}.py:{preset}@preset@bfloat16@pallas")
    out.append(pytest.param(DEVICES[preset], part, id=f"{name}-{preset}"))
  return out


def run_worker(n_devices: int, job_list: list[str]) -> list[dict]:
  env = dict(
      os.environ,
      PYTHONPATH=str(REPO),
      XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}",
      JAX_PLATFORMS="cpu",
  )
  proc = subprocess.run(
      [sys.executable, str(WORKER), str(n_devices), *job_list],
      env=env,
      capture_output=True,
      text=True,
      timeout=1500,
      cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("n_devices,job_list", jobs())
def test_paper_configs_lower_for_tpu_and_cuda(n_devices, job_list):
  results = run_worker(n_devices, job_list)
  steps = lowering.STEPS
  assert sorted((r["job"], r["step"], r["platform"]) for r in results) == sorted(
      (j, s, p) for j in job_list for s in steps for p in ("tpu", "cuda")
  )
  failed = [f"{r['job']} {r['step']} {r['platform']}: {r['error']}" for r in results if not r["ok"]]
  assert not failed, "\n".join(failed)


def test_a_host_callback_in_a_step_fails_the_lowering(tmp_path):
  """The check can fail: a step with a host callback (here jax.debug.print
  in the model, through a patched worker) is reported with the config's
  name."""
  patched = tmp_path / "worker.py"
  patched.write_text(
      WORKER.read_text()
      .replace(
          "REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))",
          f"REPO = {str(REPO)!r}",
      )
      .replace(
          "def run(job: str, n_devices: int) -> None:",
          "def run(job: str, n_devices: int) -> None:\n"
          "  import jax\n"
          "  from transformer_xl.model import models\n"
          "  orig = models.TransformerXL.nll\n"
          "  def nll(self, *a, **k):\n"
          "    out = orig(self, *a, **k)\n"
          "    jax.debug.print('nll {}', out.sum())\n"
          "    return out\n"
          "  models.TransformerXL.nll = nll\n",
      )
  )
  env = dict(
      os.environ,
      PYTHONPATH=str(REPO),
      XLA_FLAGS="--xla_force_host_platform_device_count=8",
      JAX_PLATFORMS="cpu",
  )
  proc = subprocess.run(
      [sys.executable, str(patched), "8", "configs/ptb.py@gpu8@float32@xla"],
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = {(r["step"], r["platform"]): r for r in map(json.loads, proc.stdout.splitlines())}
  for key in (("train", "tpu"), ("train", "cuda"), ("eval", "tpu"), ("eval", "cuda")):
    assert not results[key]["ok"], key
    assert "callback" in results[key]["traceback"], results[key]["traceback"]
