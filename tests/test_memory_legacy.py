"""Files written before the memory variants owned their settings keep working.

Until commit 3ea4d5c the variants' settings were flat keys: ``model.cmem_len``,
``model.cmem_ratio``, ``model.cmem_fn``, ``model.num_mem_tokens``,
``model.mem_at_end``, ``model.read_mem_from_cache`` and ``eval.cmem_len``
(-1 = the model's), in ``config.json``, ``model_config.json`` and every
checkpoint's record.  ``tests/fixtures/legacy_workdirs/`` holds two tiny
workdirs that code wrote (scripts/make_legacy_workdirs.py: a compressive
memory, memory tokens beside an XL cache; synthetic copy task, one device),
each trained to step 2 and evaluated, and the step-3 checkpoint that code
reached from there.  Today's code reads their configs into the variants'
sections, evaluates the step-2 checkpoint to the scores that code wrote,
and resumes it to a step 3 equal to that code's (bit for bit on the machine
that made the fixtures, which also made tests/fixtures/memory_bitwise.npz:
the CPU model and XLA's backend optimisation level; to float32 rounding
on another).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import eval_modes
from transformer_xl.model import config as model_config_lib
from transformer_xl.model import memory
from transformer_xl.run import workdir as wd
from transformer_xl.training import train

from helpers import CONFIGS, load_module, run_main

FIXTURES = Path(__file__).parent / "fixtures"
LEGACY = FIXTURES / "legacy_workdirs"


def _same_cpu() -> bool:
  """Whether this machine (CPU model, XLA optimisation level) made the fixtures."""
  script = load_module(Path(__file__).parents[1] / "scripts" / "make_memory_fixtures.py", "mmf")
  return str(np.load(FIXTURES / "memory_bitwise.npz")["machine"]) == script.machine()


def _copy(name: str, tmp_path: Path) -> Path:
  out = tmp_path / name
  shutil.copytree(LEGACY / name, out)
  return out


def test_the_flat_keys_load_into_the_variants_sections(tmp_path):
  comp, toks = _copy("compressive", tmp_path), _copy("tokens", tmp_path)
  saved = json.loads((comp / "config.json").read_text())
  assert saved["model"]["cmem_len"] == 4 and saved["eval"]["cmem_len"] == 6  # the old layout
  config = wd.load_config(str(comp))
  assert config.model.memory == "compressive"
  assert config.model.compressive.to_dict() == {"cmem_len": 4, "cmem_ratio": 2, "cmem_fn": "conv"}
  assert config.eval.compressive.cmem_len == 6 and "cmem_len" not in config.eval
  cfg, unit = wd.load_model_config(str(comp))
  assert memory.compressive.CompressiveMemory.settings(cfg).cmem_len == 4
  tokens = wd.load_model_config(str(toks))[0]
  s = memory.tokens.MemoryTokens.settings(tokens)
  assert (s.num_mem_tokens, s.mem_at_end, s.read_mem_from_cache) == (2, True, True)
  assert [v.name for v in memory.plan(tokens).variants] == ["xl", "tokens"]
  assert wd.load_config(str(toks)).eval.compressive.cmem_len is None  # -1 meant the model's
  # A checkpoint's record (flat) and today's (sections) name the same model.
  record = json.loads((comp / "checkpoints" / "2" / "integrity" / "metadata").read_text())
  old = model_config_lib.flat_fields(record["meta"]["model"], complete=True)
  assert old == json.loads(json.dumps(model_config_lib.flat_fields(cfg.to_dict(), complete=True)))
  assert "compressive.cmem_len" in old


def test_a_flat_key_and_its_section_disagreeing_is_read_as_the_section():
  fields = memory.upgrade_fields({"cmem_len": 4, "compressive": {"cmem_len": 8}})
  assert fields == {"compressive": {"cmem_len": 8}}
  assert memory.upgrade_eval({"cmem_len": -1, "tgt_len": 3}) == {
      "tgt_len": 3,
      "compressive": {"cmem_len": None},
  }


@pytest.mark.parametrize("name", ["compressive", "tokens"])
def test_the_old_checkpoint_evaluates_to_the_scores_it_was_written_with(name, tmp_path):
  workdir = _copy(name, tmp_path)
  before = json.loads((workdir / "eval_results.json").read_text())
  config = wd.load_config(str(workdir))
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  corpus = data.load_configured(config.data.to_dict())
  after = eval_modes.run_eval(config, str(workdir), corpus, mesh)
  exact = _same_cpu()
  for split in ("valid", "test"):
    for key in ("loss_nats", "answer_token_accuracy", "tokens"):
      if exact:
        assert after[split][key] == before[split][key], (split, key)
      else:
        assert after[split][key] == pytest.approx(before[split][key], rel=1e-5)
  if name == "compressive":  # the evaluation's own compressed slots, as recorded then
    assert before["eval"]["cmem_len"] == 6 and after["eval"]["compressive"] == {"cmem_len": 6}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["compressive", "tokens"])
def test_the_old_checkpoint_resumes_to_the_step_that_code_reached(name, tmp_path):
  workdir = _copy(name, tmp_path)
  config = wd.load_config(str(workdir))
  config.train.num_steps = 3
  default_config.validate(config, 1)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  train.train_and_evaluate(config, str(workdir), data.load_configured(config.data.to_dict()), mesh)
  got, want = workdir / "checkpoints" / "3", LEGACY / f"{name}_step3" / "checkpoints" / "3"
  prints = lambda d: {
      k: v["fingerprint"]
      for k, v in json.loads((d / "integrity" / "metadata").read_text())["leaves"].items()
  }
  assert set(prints(got)) == set(prints(want))  # the same leaves, by name
  if _same_cpu():
    assert prints(got) == prints(want)
  with ocp.StandardCheckpointer() as ckpt:
    a, b = ckpt.restore(got / "state"), ckpt.restore(want / "state")
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize(
    "flag, new",
    [
        ("--config.model.num_mem_tokens=2", "--config.model.tokens.num_mem_tokens"),
        ("--config.eval.cmem_len=8", "--config.eval.compressive.cmem_len"),
    ],
)
def test_a_flat_flag_of_before_names_its_new_key(flag, new, tmp_path):
  r = run_main([f"--config={CONFIGS / 'quickstart.py'}", f"--workdir={tmp_path / 'w'}", flag])
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  line = r.stderr.strip().splitlines()[-1]
  assert line.startswith(f"error: {flag.split('=')[0]} is now {new} "), line
  assert not (tmp_path / "w").exists()
