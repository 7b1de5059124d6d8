"""Every registered memory variant through the real command line: one ladder.

For each variant of ``memory.VARIANTS`` (the package's and the test-only
ones of ``tests/memory_variants/``, registered before the command line reads
its config, as a user's own variant would be), in subprocesses on a tiny
PTB-format corpus (``helpers.write_ptb_sample``), with the variant's
``example()`` settings:

1. train 2 steps, then a second command to step 4 that resumes: its losses
   and parameters equal those of a run straight to step 4 (the memory comes
   back from the checkpoint; a constant learning rate);
2. ``--mode=eval`` on the step-2 checkpoint, and each variant's
   ``EVAL_WITHOUT`` scoring (the kNN memory's ``without_knn``);
3. ``--mode=score --tokens`` of the valid split in the evaluation's layout:
   equal to the model run in this process on the checkpoint's parameters
   (``helpers.reference_nll``), and not equal to the same model with its
   memory reset before every segment (a command that dropped the memory
   fails here);
4. ``--mode=generate``, greedy, after a prompt of three segments whose next
   token the memory decides (the last segment alone gives another): the
   first token is the model's most likely one here;
5. a bad setting of the variant refused in one ``error:`` line before
   anything is compiled or written.

The variants' own properties are held in-process by
test_memory_conformance.py; what their commands add (the kNN fine-tuning
recipe, the ARMT converter) is in test_knn_cli.py and test_armt_convert.py.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

import memory_variants  # noqa: F401  (registers the test-only variants)
from helpers import (
    memory_run_flags,
    ptb_valid_rows,
    read_metrics,
    reference_nll,
    run_main,
    run_python,
    small_args,
    write_ptb_sample,
)

pytestmark = pytest.mark.slow  # seven commands a variant, three of them train

T, M, ROWS = 8, 8, 2  # segment and XL cache (training and evaluation), eval rows
PACKAGE_VARIANTS = ("armt", "compressive", "knn", "tokens", "xl")

# The command line with the test-only variants registered first: what a user's own launcher
# for a variant outside the package does (import it, then run the package's main).
_MAIN_WITH_TEST_VARIANTS = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    import memory_variants
    from absl import app
    from transformer_xl import main
    from transformer_xl.cli import user_errors
    app.run(main.main, flags_parser=user_errors.parse_flags)
    """)


def _main(name: str, *args: Any) -> subprocess.CompletedProcess:
  """The command line with ARGS on one CPU device (sharding is the
  conformance suite's), compilations logged (JAX_LOG_COMPILES)."""
  env = {"JAX_LOG_COMPILES": "1"}
  if name in PACKAGE_VARIANTS:
    return run_main(args, env=env, devices=1)
  return run_python(["-c", _MAIN_WITH_TEST_VARIANTS, *args], env=env, devices=1)


def _ok(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout + r.stderr


def _flag_value(value: Any) -> str:
  return str(tuple(value)) if isinstance(value, (list, tuple)) else str(value)


def _variant_flags(name: str) -> list[str]:
  """The ``--config.model.*`` flags of the variant's ``example()``."""
  flags = []
  for key, value in memory_lib.VARIANTS[name].example().items():
    if isinstance(value, dict):
      flags += [f"--config.model.{key}.{k}={_flag_value(v)}" for k, v in value.items()]
    else:
      flags.append(f"--config.model.{key}={value}")
  return flags


def _run_flags(name: str) -> list[str]:
  """The tiny model of the variant, evaluated with the training lengths, at a
  constant learning rate (a resumed schedule equals a straight one)."""
  cls = memory_lib.VARIANTS[name]
  return [
      *memory_run_flags(
          T,
          M,
          ROWS,
          train__min_lr=0.05,
          # The memories learned through segments (memory tokens, ARMT) train through one.
          train__mem_backprop_depth=1 if cls.GRADIENT_THROUGH_SEGMENTS else 0,
      ),
      *_variant_flags(name),
  ]


def _bad_setting(name: str) -> tuple[str, str]:
  """(a flag, the key its error names): the variant's first integer setting
  made negative, or the XL cache's length for a variant without one (its
  message names the key without the value)."""
  for key, value in memory_lib.VARIANTS[name].example().items():
    if isinstance(value, dict):
      for k, v in value.items():
        if isinstance(v, int) and not isinstance(v, bool):
          return f"--config.model.{key}.{k}=-1", f"model.{key}.{k}=-1"
  return "--config.model.mem_len=-1", "mem_len"


def _eval_model(workdir: Path) -> models.ModelConfig:
  """The trained model (model_config.json) with the eval segments, no dropout."""
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  fields = {**saved, "tgt_len": T, "mem_len": M, "dropout": 0.0, "dropatt": 0.0}
  return models.ModelConfig.from_dict(fields)


def _restore(workdir: Path, step: int) -> dict:
  return ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")


def _next_log_probs(cfg, params, context_BxL: np.ndarray) -> np.ndarray:
  """float32 [B, V]: log p(next token | context), the context run in segments
  of T from a fresh memory (L a multiple of T)."""
  model = models.TransformerXL(cfg)
  hidden = jax.jit(lambda x, m: model.apply({"params": params}, x, m, method=model.hidden))
  memory = memory_lib.init_memory(cfg, context_BxL.shape[0])
  for s in range(context_BxL.shape[1] // T):
    h_BxTxD, memory = hidden(context_BxL[:, s * T : (s + 1) * T], memory)
  return np.asarray(model.apply({"params": params}, h_BxTxD[:, -1:], method=model.log_probs))[:, 0]


def _each_segment_fresh(cfg, params, tokens_BxT1: np.ndarray) -> np.ndarray:
  """``reference_nll`` with the memory reset before every segment: each
  segment (and its next token) a row of its own."""
  b, t = tokens_BxT1.shape[0], tokens_BxT1.shape[1] - 1
  n_seg = t // T
  rows = np.stack([tokens_BxT1[:, s * T : (s + 1) * T + 1] for s in range(n_seg)], axis=1).reshape(
      b * n_seg, T + 1
  )
  return reference_nll(cfg, params, rows).reshape(b, n_seg * T)


@pytest.mark.parametrize("name", sorted(memory_lib.VARIANTS))
def test_train_resume_eval_score_generate_and_refuse(name, tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 30, 8))
  workdir, straight = tmp_path / "wd", tmp_path / "straight"
  flags = _run_flags(name)
  train = lambda w, steps: _main(
      name, *small_args(tmp_path, w, manual, *flags, f"--config.train.num_steps={steps}")
  )
  cls = memory_lib.VARIANTS[name]

  # -- train 2 steps: the variant and its settings are saved ----------------------------------
  _ok(train(workdir, 2))
  for file in ("config.json", "model_config.json"):
    saved = json.loads((workdir / file).read_text())["model"]
    for key, value in cls.example().items():
      got = saved[key]
      if isinstance(value, dict):
        got = {k: got[k] for k in value}
        value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
      assert got == value, (file, key, got, value)
  for row in read_metrics(workdir).values():  # the training loss plus the memory's own losses
    aux = sum(v for k, v in row.items() if k.startswith("train/aux_loss/"))
    assert row.get("train/total_loss", row["train/loss"]) == pytest.approx(
        row["train/loss"] + aux, rel=1e-6
    )
  params = _restore(workdir, 2)["params"]

  # -- eval, and the scoring without the variant's own memory where it has one ----------------
  _ok(_main(name, f"--workdir={workdir}", "--mode=eval"))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["step"] == 2 and np.isfinite(results["valid"]["loss_nats"])
  for split in ("valid", "test"):
    without = results[split].get(f"without_{name}")
    if cls.EVAL_WITHOUT:
      assert without["eval"] == dict(cls.EVAL_WITHOUT), without
      assert without["tokens"] == results[split]["tokens"]
    else:
      assert without is None, results[split]

  # -- score the valid split as eval lays it out: the model run here --------------------------
  corpus, tokens, n = ptb_valid_rows(tmp_path, manual, ROWS)
  assert n // ROWS > 4 * T, n
  np.save(tmp_path / "tokens.npy", tokens)
  out = _ok(
      _main(
          name,
          f"--workdir={workdir}",
          "--mode=score",
          f"--tokens={tmp_path / 'tokens.npy'}",
          f"--out={tmp_path / 'nll.npy'}",
      )
  )
  assert f"scored {n} tokens" in out
  nll = np.load(tmp_path / "nll.npy")
  assert nll.shape == (ROWS, n // ROWS) and nll.dtype == np.float32
  assert nll.astype(np.float64).mean() == pytest.approx(results["valid"]["loss_nats"], abs=1e-5)
  cfg = _eval_model(workdir)
  ref = reference_nll(cfg, params, tokens)
  np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
  # The memory is read: every segment from a fresh memory scores the first segment the same,
  # the later ones not.
  k = (n // ROWS) // T * T
  fresh = _each_segment_fresh(cfg, params, tokens[:, : k + 1])
  np.testing.assert_allclose(fresh[:, :T], ref[:, :T], rtol=1e-5, atol=1e-5)
  assert np.abs(fresh[:, T:] - ref[:, T:k]).max() > 1e-4

  # -- generate greedily after three segments: the first token is the memory's ---------------
  # Of 256 random prompts (the boundary symbol and 3 T - 1 words), one whose next token is not
  # the one the last segment alone (a fresh memory) gives.
  words = [i for i, w in enumerate(corpus.vocab) if w not in ("<eos>", "<unk>")]
  prompts = np.random.default_rng(0).choice(words, size=(256, 3 * T - 1))
  context = np.concatenate([np.full((256, 1), corpus.boundary_id), prompts], 1).astype(np.int32)
  logp = _next_log_probs(cfg, params, context)
  first, alone = logp.argmax(1), _next_log_probs(cfg, params, context[:, -T:]).argmax(1)
  k = int(np.argmax(first != alone))
  assert first[k] != alone[k], "no prompt's next token depends on the memory"
  samples = tmp_path / "samples.json"
  out = _ok(
      _main(
          name,
          f"--workdir={workdir}",
          "--mode=generate",
          f"--prompt={' '.join(corpus.vocab[i] for i in prompts[k])}",
          "--num_tokens=4",
          "--top_k=1",
          f"--out={samples}",
      )
  )
  got = json.loads(samples.read_text())
  assert got["prompt_tokens"] == context[k].tolist()
  gen = got["samples"][0]["tokens"]
  assert len(gen) == 4 and got["samples"][0]["text"].strip() in out
  assert logp[k, gen[0]] >= logp[k].max() - 1e-5, (gen[0], first[k])

  # -- resume to step 4: as a run straight to step 4 ------------------------------------------
  out = _ok(train(workdir, 4))
  assert "Resumed from" in out and "at step 2" in out
  _ok(train(straight, 4))
  once, twice = read_metrics(straight), read_metrics(workdir)
  assert sorted(once) == sorted(twice) == [1, 2, 3, 4]
  assert [twice[s]["train/loss"] for s in once] == [once[s]["train/loss"] for s in once]
  jax.tree_util.tree_map(
      np.testing.assert_array_equal, _restore(workdir, 4)["params"], _restore(straight, 4)["params"]
  )

  # -- a bad setting: one line, nothing compiled, nothing written -----------------------------
  flag, named = _bad_setting(name)
  bad = tmp_path / "bad"
  r = _main(name, *small_args(tmp_path, bad, manual, *flags, flag, "--config.train.num_steps=2"))
  assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert not [l for l in r.stderr.splitlines() if "Compiling" in l], r.stderr[-3000:]
  assert named in r.stderr, (named, r.stderr[-3000:])
  assert not bad.exists()
