"""The compressive memory (Rae et al. 2020) through the real command line.

``python -m transformer_xl.main`` in subprocesses, one command each, on a
tiny PTB-format corpus (``helpers.write_ptb_sample``): train a
compressive model (conv compression, c = 2), then ``--mode=eval``,
``--mode=score --tokens``, ``--mode=generate`` on its workdir, a second
train command that resumes it, and bad input refused before anything is
compiled.  Seven subprocesses in all (two of them stop at the config check).

The scores are compared with an independent computation in this process:
the checkpoint's parameters restored with orbax and run through
``models.TransformerXL`` segment by segment with the evaluation lengths,
one device, no ``Evaluator``, no workdir config (the model itself is held
to the naive Compressive Transformer in ``test_compressive_memory.py``).
The same parameters without the compressed memory
(``model.compressive.cmem_len=0``, which is Transformer-XL exactly) score
the same tokens differently, so a command that dropped the compressed slots
would fail here (checked: eval and score with ``cmem_len=0`` in
``eval_steps.eval_model_config``, and generate with it in
``generate.Generator``, each fail a test).  Training runs at learning
rate 0.05 so that in 3 steps the compression network, which only the
reconstruction loss trains, moves far enough from its initialisation for the
compressed slots to change the scores by about 0.05 nats.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

from helpers import (
    ptb_valid_rows,
    reference_nll,
    run_main,
    small_args,
    tiny_flags,
    write_ptb_sample,
)

pytestmark = pytest.mark.slow  # seven commands, two of them train: 70-90 s on 2 shared cores

T, M, NC, C = 8, 8, 8, 2  # eval segment, memory, compressed slots, compression rate
ROWS = 2  # eval.global_batch: the valid split in 2 rows
TINY = [
    *tiny_flags(
        model__d_model=16,
        model__d_head=8,
        model__d_inner=32,
        model__tgt_len=T,
        model__mem_len=M,
        train__global_batch=None,
        train__warmup_steps=0,
        train__learning_rate=0.05,
        # The evaluation settings, saved in config.json for eval, score and generate.
        eval__tgt_len=T,
        eval__mem_len=M,
        eval__same_length=False,
        eval__clamp_len=0,
        eval__global_batch=ROWS,
        model__compressive__cmem_len=NC,
        model__compressive__cmem_ratio=C,
        model__compressive__cmem_fn="conv",
    ),
    "--config.model.memory=compressive",
]


def _main(*args: str) -> subprocess.CompletedProcess:
  """``python -m transformer_xl.main ARGS``, logging every compilation (JAX_LOG_COMPILES)."""
  return run_main(args, env={"JAX_LOG_COMPILES": "1"})


def _ok(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout + r.stderr


def _params(workdir: Path, step: int) -> dict:
  state = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")
  return state["params"]


def _eval_model(workdir: Path, cmem_len: int | None = None) -> models.ModelConfig:
  """The trained model (model_config.json) with the eval segments, no dropout;
  ``cmem_len``: its compressed slots instead of the trained model's."""
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  fields = {**saved, "tgt_len": T, "mem_len": M, "dropout": 0.0, "dropatt": 0.0}
  cfg = models.ModelConfig.from_dict(fields)
  return cfg if cmem_len is None else cfg.with_memory("compressive", cmem_len=cmem_len)


def _without_compression(params: dict) -> dict:
  """The parameters of memory='xl' (cmem_len=0 has no compression network)."""
  layers = {k: v for k, v in params["layers"].items() if not k.startswith("cmem_")}
  return {**params, "layers": layers}


def _next_log_probs(cfg: models.ModelConfig, params: dict, context_BxL: np.ndarray) -> np.ndarray:
  """float32 [B, V]: log p(next token | context), the context run in segments of T from an
  empty memory (L a multiple of T)."""
  model = models.TransformerXL(cfg)
  hidden = jax.jit(lambda x, m: model.apply({"params": params}, x, m, method=model.hidden))
  memory = memory_lib.init_memory(cfg, context_BxL.shape[0])
  for s in range(context_BxL.shape[1] // T):
    h_BxTxD, memory = hidden(context_BxL[:, s * T : (s + 1) * T], memory)
  return np.asarray(model.apply({"params": params}, h_BxTxD[:, -1:], method=model.log_probs))[:, 0]


def _refused(r: subprocess.CompletedProcess, *phrases: str) -> None:
  """One ``error:`` line (the problems listed under it), exit 1, no traceback,
  nothing compiled and nothing on stdout."""
  assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1, r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  assert not [l for l in r.stderr.splitlines() if "Compiling" in l], r.stderr[-3000:]
  assert r.stdout == ""
  for phrase in phrases:
    assert phrase in r.stderr, (phrase, r.stderr[-3000:])


def test_train_eval_score_generate_and_resume_from_the_command_line(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 8, 8))
  workdir = tmp_path / "wd"
  train = lambda steps: _main(
      *small_args(tmp_path, workdir, manual, *TINY, f"--config.train.num_steps={steps}")
  )

  # -- train: the variant is saved, the reconstruction loss logged apart ----------------------
  _ok(train(3))
  for name in ("config.json", "model_config.json"):
    saved = json.loads((workdir / name).read_text())["model"]
    assert (saved["memory"], saved["compressive"]) == (
        "compressive",
        {"cmem_len": NC, "cmem_ratio": C, "cmem_fn": "conv"},
    ), name
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "train/loss" in r]
  recon = [r["train/aux_loss/attn_recon"] for r in rows]
  # Step 1 starts from an empty memory (nothing evicted, nothing compressed); from step 2 the
  # T evicted states are compressed and the reconstruction error is positive.
  assert [r["step"] for r in rows] == [1, 2, 3] and recon[0] == 0, rows
  assert all(np.isfinite(x) and x > 0 for x in recon[1:]), recon
  for r in rows:  # the LM loss plus the unweighted reconstruction loss (aux_loss_weight 1)
    assert r["train/total_loss"] == pytest.approx(
        r["train/loss"] + r["train/aux_loss/attn_recon"], rel=1e-6
    )

  # -- eval: the valid split in ROWS rows of eval.tgt_len segments ----------------------------
  _ok(_main(f"--workdir={workdir}", "--mode=eval"))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["step"] == 3
  assert results["eval"] == {
      "method": "segments",
      "tgt_len": T,
      "mem_len": M,
      "clamp_len": 0,
      "same_length": False,
      "compressive": {"cmem_len": NC},  # eval.compressive.cmem_len unset: the model's
  }
  # The evaluation's layout (helpers.ptb_valid_rows), each row from an empty memory.
  corpus, tokens, n = ptb_valid_rows(tmp_path, manual, ROWS)
  n_valid = corpus.splits["valid"].num_tokens  # equal rows: one score array
  assert results["valid"]["tokens"] == n == n_valid, (n, n_valid)
  per_row = n // ROWS  # enough segments that the compressed memory fills and is truncated
  assert per_row > (1 + NC // (T // C)) * T  # the 4th segment truncates the full memory
  np.save(tmp_path / "tokens.npy", tokens)

  # -- score: the same rows with the same eval settings ---------------------------------------
  out = _ok(
      _main(
          f"--workdir={workdir}",
          "--mode=score",
          f"--tokens={tmp_path / 'tokens.npy'}",
          f"--out={tmp_path / 'nll.npy'}",
      )
  )
  nll = np.load(tmp_path / "nll.npy")
  assert nll.shape == (ROWS, per_row) and nll.dtype == np.float32
  assert f"scored {n} tokens" in out
  # eval's loss is the mean of score's per-token NLLs over the same tokens.
  assert nll.astype(np.float64).mean() == pytest.approx(results["valid"]["loss_nats"], abs=1e-5)
  params = _params(workdir, 3)
  ref = reference_nll(_eval_model(workdir), params, tokens)
  np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
  # The compressed slots are read: without them (Transformer-XL, same weights) the scores of
  # the segments after the first compression differ, those before it do not.
  xl = reference_nll(_eval_model(workdir, cmem_len=0), _without_compression(params), tokens)
  np.testing.assert_allclose(xl[:, : 2 * T], ref[:, : 2 * T], rtol=1e-5, atol=1e-5)
  assert np.abs(xl[:, 2 * T :] - ref[:, 2 * T :]).max() > 1e-4

  # -- generate: greedy, after a prompt whose next token the compressed memory decides ---------
  # Prompts of 3 segments (the boundary symbol and 3 T - 1 words): the compressed memory is full
  # after them.  Of 4,096 random ones (about 9 qualify), the one where the model's most likely
  # next token leads by the widest margin (> 1e-3) and is not Transformer-XL's with the same
  # weights.
  cfg, cfg_xl = _eval_model(workdir), _eval_model(workdir, cmem_len=0)
  word_ids = [i for i, w in enumerate(corpus.vocab) if w not in ("<eos>", "<unk>")]
  prompts = np.random.default_rng(0).choice(word_ids, size=(4096, 3 * T - 1))
  context = np.concatenate([np.full((4096, 1), corpus.boundary_id), prompts], 1).astype(np.int32)
  logp = _next_log_probs(cfg, params, context)
  top2 = np.sort(logp, axis=1)[:, -2:]
  first = logp.argmax(1)
  first_xl = _next_log_probs(cfg_xl, _without_compression(params), context).argmax(1)
  margin = np.where(first != first_xl, top2[:, 1] - top2[:, 0], 0.0)
  k = int(margin.argmax())
  assert margin[k] > 1e-3, "no prompt's next token depends on the compressed memory"
  prompt = " ".join(corpus.vocab[i] for i in prompts[k])
  samples = tmp_path / "samples.json"
  printed = _main(
      f"--workdir={workdir}",
      "--mode=generate",
      f"--prompt={prompt}",
      "--num_tokens=10",
      "--top_k=1",
      f"--out={samples}",
  )
  _ok(printed)
  got = json.loads(samples.read_text())
  assert got["prompt"] == prompt and got["prompt_tokens"] == context[k].tolist()
  gen = got["samples"][0]["tokens"]
  assert len(gen) == 10 and all(0 <= g < corpus.vocab_size for g in gen)
  assert got["samples"][0]["text"].strip() in printed.stdout
  assert gen[0] == first[k] != first_xl[k]
  # Each later token is the most likely one after the prompt and the tokens before it, fed one
  # at a time (c > 1: they evict states but compress none), as the model computes it here.
  model = models.TransformerXL(cfg)
  hidden = jax.jit(lambda x, m: model.apply({"params": params}, x, m, method=model.hidden))
  log_probs = jax.jit(lambda h: model.apply({"params": params}, h, method=model.log_probs))
  memory, row = memory_lib.init_memory(cfg, 1), context[k][None]
  for s in range(3):
    h, memory = hidden(row[:, s * T : (s + 1) * T], memory)
  assert int(memory.mlen_B[0]) == M + NC
  for g in gen:
    lp = np.asarray(log_probs(h[:, -1:]))[0, 0]
    assert lp[g] >= lp.max() - 1e-5, (g, int(lp.argmax()))
    h, memory = hidden(jnp.asarray([[g]], jnp.int32), memory)

  # -- resume: a second train command continues from step 3 -----------------------------------
  out = _ok(train(5))
  assert "Resumed from" in out and "at step 3" in out
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps[-1] == 5
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
  # The memory came back from the checkpoint: step 4 compresses at once (a fresh memory would
  # give step 4 a reconstruction loss of 0, as step 1).
  assert all(r["train/aux_loss/attn_recon"] > 0 for r in rows[3:]), rows[3:]


def test_bad_compressive_settings_are_refused_before_anything_is_compiled(tmp_path):
  """Both without a trained workdir: --mode=eval on a config file, and training."""
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(20, 4, 4))
  workdir = tmp_path / "wd"
  # An evaluation segment that the compression cannot cut into groups of c, and an unknown
  # compression function: both named, under one error line.
  r = _main(
      *small_args(
          tmp_path,
          workdir,
          manual,
          *TINY,
          "--mode=eval",
          f"--config.eval.tgt_len={T - 1}",
          "--config.model.compressive.cmem_fn=avg",
      )
  )
  _refused(
      r,
      f"eval.tgt_len={T - 1} must be a multiple of model.compressive.cmem_ratio={C}",
      "model.compressive.cmem_fn='avg': use one of",
  )
  # Compressed memory settings, for training and for evaluation, without the compressive
  # variant: both named, under one error line.
  r = _main(
      *small_args(
          tmp_path,
          workdir,
          manual,
          *TINY,
          "--config.model.memory=xl",
          f"--config.eval.compressive.cmem_len={2 * NC}",
          "--config.train.num_steps=2",
      )
  )
  _refused(
      r,
      f"model.compressive.cmem_len={NC} is a setting of model.memory='compressive' (the model "
      "has 'xl')",
      f"eval.compressive.cmem_len={2 * NC} needs the model's memory 'compressive'",
  )
  assert not workdir.exists()  # nothing written: no checkpoint, no config
