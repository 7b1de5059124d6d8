"""Why wt103_large's loss on random tokens sits at ~20.6 nats: the adaptive
softmax at initialisation, in float32 and bfloat16, ours and the PyTorch port.

``accelerator.py`` on one H200 (bf16) left wt103_large at 20.57 nats after
13 steps on random tokens, above the 12.5 of a uniform distribution over its
267,735 words.  This tool answers on CPU whether that is bf16, a bug, or
neither: wt103_large's shape (its adaptive embedding and softmax: d_model
1,024, cutoffs 20,000 / 40,000 / 200,000, div_val 4, tied weights and
projections; ``--n_layer`` layers, default 2, of its width) trained on one
fixed batch of uniform random tokens, as ``accelerator.py`` does:

* **the expected initial loss** of an adaptive softmax whose logits are all
  about 0 (Grave et al. 2017's structure: a head of ``cutoffs[0]`` words and
  one logit per tail cluster, each tail a softmax of its own), on tokens
  drawn uniformly: ``expected_initial_nll`` (nats);
* **ours**, float32 and bfloat16 (``model.dtype``) from the same
  initialisation, at the config's learning-rate schedule (warm-up of
  16,000 steps: the rate after 20 steps is ~3e-7) and at its peak rate
  2.5e-4 from the first step: the loss of each step;
* **the HuggingFace port** (``TransfoXLLMHeadModel``, its own
  initialisation), float32, and its layers under bf16 autocast (its
  adaptive embedding and softmax in float32, as ``accelerator.py`` runs it),
  Adam at the same two rates.

Run from the repository root (about 10 minutes on 2 CPU cores)::

  python benchmarks/adaptive_init_loss.py [--steps=20] [--n_layer=2] [--json=FILE]

The findings are in ``benchmarks/results/REPORT.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VOCAB = 267_735  # WikiText-103's words (configs/wt103_large.py's n_token)


def expected_initial_nll(vocab: int, cutoffs: Sequence[int]) -> float:
  """The mean NLL (nats) of tokens drawn uniformly from ``vocab`` under an
  adaptive softmax whose logits are all equal (an initialisation's, about):
  a head token costs log(head), a tail token log(head) + log(its cluster's
  size), head = cutoffs[0] + the number of tail clusters."""
  bounds = [0, *cutoffs, vocab]
  head = cutoffs[0] + len(cutoffs)
  nll = 0.0
  for i in range(len(bounds) - 1):
    size = bounds[i + 1] - bounds[i]
    nll += size / vocab * (math.log(head) + (math.log(size) if i else 0.0))
  return nll


def _config(n_layer: int, dtype: str, tgt_len: int, batch: int):
  spec = importlib.util.spec_from_file_location(
      "wt103_large", os.path.join(common.REPO, "configs", "wt103_large.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.model.update(n_layer=n_layer, dtype=dtype, tgt_len=tgt_len, mem_len=tgt_len, dropout=0.0)
  c.model.update(dropatt=0.0)
  c.train.update(global_batch=batch, batch_chunk=1)
  return c


def ours(args, dtype: str, warmup: bool) -> list[float]:
  """Our train step's loss at each of ``args.steps`` steps on one batch."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from transformer_xl import sharding  # noqa: PLC0415
  from transformer_xl.model import models  # noqa: PLC0415
  from transformer_xl.training import lowering, train_state, train_step  # noqa: PLC0415

  c = _config(args.n_layer, dtype, args.tgt_len, args.batch)
  if not warmup:
    c.train.update(warmup_steps=0)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  mcfg = lowering.resolved_model_config(c, VOCAB)
  assert mcfg.dtype == dtype, (mcfg.dtype, dtype)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(c.train)
  _, shardings = train_state.abstract_train_state(model, tx, args.batch, mesh)
  state = train_state.create_train_state(
      model, tx, args.batch, mesh, jax.random.PRNGKey(0), shardings
  )
  step = train_step.make_train_step(model, tx, mesh, shardings, 1, 0)
  rng = np.random.default_rng(0)
  shape = (args.batch, args.tgt_len)
  batch = {
      "inputs": rng.integers(0, VOCAB, shape, dtype=np.int32),
      "targets": rng.integers(0, VOCAB, shape, dtype=np.int32),
      "weights": np.ones(shape, np.float32),
      "reset": np.zeros(args.batch, bool),
  }
  losses = []
  for _ in range(args.steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return losses


def huggingface(args, autocast: bool, lr: float) -> list[float]:
  """The PyTorch port's loss at each step (Adam at ``lr``, clip 0.25, the
  config's), its layers under bf16 autocast when ``autocast``."""
  import numpy as np  # noqa: PLC0415
  import torch  # noqa: PLC0415
  from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: PLC0415

  m = _config(args.n_layer, "float32", args.tgt_len, args.batch).model
  torch.manual_seed(0)
  hf = TransfoXLConfig(
      vocab_size=VOCAB,
      cutoffs=list(m.cutoffs),
      div_val=m.div_val,
      d_model=m.d_model,
      d_embed=m.d_embed or m.d_model,
      n_head=m.n_head,
      d_head=m.d_head,
      d_inner=m.d_inner,
      n_layer=m.n_layer,
      mem_len=m.mem_len,
      dropout=0.0,
      dropatt=0.0,
      tie_projs=list(m.tie_projs),
      tie_word_embeddings=m.tie_weight,
  )
  model = TransfoXLLMHeadModel(hf).train()
  opt = torch.optim.Adam(model.parameters(), lr=lr)
  rng = np.random.default_rng(0)
  x = torch.from_numpy(rng.integers(0, VOCAB, (args.batch, args.tgt_len)).astype(np.int64))
  y = torch.from_numpy(rng.integers(0, VOCAB, (args.batch, args.tgt_len)).astype(np.int64))
  losses = []
  for _ in range(args.steps):
    emb = model.transformer.word_emb(x)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
      res = model.transformer(inputs_embeds=emb)
    hidden = res.last_hidden_state.float()
    # crit(hidden, labels) scores labels[t + 1] from hidden[t]: give it the targets as the
    # labels of the next positions (a dummy first column), so hidden[t] scores y[t].
    labels = torch.cat([y[:, :1], y], dim=1)
    loss = model.crit(torch.cat([hidden, hidden[:, :1]], dim=1), labels).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(float(loss))
  return losses


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--n_layer", type=int, default=2)
  p.add_argument("--tgt_len", type=int, default=64)
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--no_pytorch", action="store_true")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  if min(args.steps, args.n_layer, args.tgt_len, args.batch) < 1:
    sys.exit("error: --steps, --n_layer, --tgt_len and --batch must be >= 1.")
  cutoffs = (20000, 40000, 200000)
  expected = expected_initial_nll(VOCAB, cutoffs)
  print(
      f"uniform over {VOCAB:,}: {math.log(VOCAB):.3f} nats; the adaptive softmax at "
      f"initialisation (logits ~0) on uniform tokens: {expected:.3f} nats",
      flush=True,
  )
  info = common.machine_info(("jax", "flax", "torch", "transformers"))
  runs: dict[str, list[float]] = {}
  peak = 2.5e-4
  for dtype in ("float32", "bfloat16"):
    for warmup in (True, False):
      name = f"ours {dtype}, " + ("the config's warm-up" if warmup else f"lr {peak:g}")
      t0 = time.perf_counter()
      runs[name] = ours(args, dtype, warmup)
      print(f"{name}: {_row(runs[name])} ({time.perf_counter() - t0:.0f} s)", flush=True)
  if not args.no_pytorch:
    for autocast in (False, True):
      for lr in (peak * args.steps / 16_000, peak):
        name = f"HF {'bf16 autocast' if autocast else 'float32'}, lr {lr:.2g}"
        t0 = time.perf_counter()
        runs[name] = huggingface(args, autocast, lr)
        print(f"{name}: {_row(runs[name])} ({time.perf_counter() - t0:.0f} s)", flush=True)
  path = args.json or common.default_json_path(platform.node(), "adaptive_init_loss_")
  common.write_json(
      path,
      {
          "args": vars(args),
          "machine": info,
          "git": common.git_commit(),
          "uniform_nll": math.log(VOCAB),
          "expected_initial_nll": expected,
          "losses": runs,
      },
  )
  return 0


def _row(losses: list[float]) -> str:
  return f"first {losses[0]:.3f}, last {losses[-1]:.3f} (min {min(losses):.3f})"


if __name__ == "__main__":
  sys.exit(main())
