r"""Writes tests/fixtures/rmt_trajectory.npz: 200 optimizer steps of the RMT authors' training.

The training-trajectory check of the memory tokens (issue 60): this
package's ``model.memory="tokens"`` is the Recurrent Memory Transformer of
booydar/LM-RMT (``pytorch/mem_transformer.py``'s ``MemTransformerLM``), so
the reference training is theirs, ``pytorch/train_synthetic.py``'s
``train()`` on their associative retrieval: their generator
(``experiment_utils/generate_data.py``'s ``retrieval_generator``, 4 pairs)
and ``data_loader`` (time-major batches of ``[X, y]``), then per batch:
``model.zero_grad()``, the batch cut into segments (``torch.chunk`` by
``tgt_len``), the learned tokens repeated over the batch and carried with
their gradient from segment to segment (``mem_tokens, loss, mems = ret``),
the loss the mean of the last ``answer_size`` positions
(``loss[-args.answer_size:]``), ``loss.backward()``,
``clip_grad_norm_(model.parameters(), args.clip)``, ``optimizer.step()``
(their ``optim.Adam(model.parameters(), lr)``) and their cosine schedule
(``CosineAnnealingLR(optimizer, max_step, eta_min)`` stepped after each
step, no warmup).  Weights: N(0, 0.02), LayerNorm weights 1 and biases 0
(their ``weights_init`` draws differently; any start will do for a
trajectory check, it only has to be the same on both sides).

Recorded: ``hparams`` (JSON), ``sd/<name>`` the initial state dict,
``inputs`` and ``targets`` [STEPS, L, B] (their batches, time-major),
``loss`` [STEPS] (before each update), ``settings/*``.

Usage:
  python scripts/make_rmt_trajectory.py /work/.mirror/booydar+LM-RMT/repo [--out tests/fixtures]

Needs torch (CPU).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import make_rmt_fixtures  # noqa: E402  (the script beside this one)
import synthetic_authors_fixture  # noqa: E402

SEED = 0
STEPS = 200
B = 8
PAIRS = 4  # their run_retrieval.sh's K
TGT_LEN = 2  # their retrieval runs' segments: 5 of 2 positions
ANSWER_SIZE = 1
LR, ETA_MIN, CLIP = 1e-3, 1e-5, 0.25
HPARAMS = dict(
    make_rmt_fixtures.BASE,
    n_token=37, d_model=32, d_head=16, d_inner=64, tgt_len=TGT_LEN, mem_len=0,
    num_mem_tokens=2, read_mem_from_cache=False, mem_at_end=True,
)  # fmt: skip


def their_batches(code: str, torch):
  """STEPS batches of their generator through their data_loader: (data_, target_) [L, B]."""
  sys.path.insert(0, code)
  from experiment_utils import generate_data as gd  # noqa: PLC0415 (their code)

  synthetic_authors_fixture._numpy2_shim(sys.modules["experiment_utils.retrieval"])  # pylint: disable=protected-access
  np.random.seed(SEED)  # their generators draw from numpy's global state
  xs, ys = [], []
  gen = gd.retrieval_generator(K=PAIRS, num_tokens=10, batch_size=B)
  for _ in range(STEPS):
    x, y, _, _ = next(gen)
    xs.append(np.asarray(x))
    ys.append(np.asarray(y))
  with tempfile.TemporaryDirectory() as d:
    np.save(f"{d}/retrieval_train_X.npy", np.concatenate(xs))
    np.save(f"{d}/retrieval_train_y.npy", np.concatenate(ys))
    loader = gd.data_loader("train", "retrieval", path=d, batch_size=B, tgt_len=TGT_LEN)
    batches = []
    for src, tgt, _ in loader:
      batches.append((src.clone(), tgt.clone()))
      if len(batches) == STEPS:
        break
  del torch
  return batches


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("source", help="their checkout, or a (bare) git repository of it")
  ap.add_argument(
      "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
  )
  a = ap.parse_args(argv)
  import torch  # pylint: disable=import-outside-toplevel

  torch.Tensor.cuda = lambda self, *args, **kw: self  # their masks; no GPU needed
  with tempfile.TemporaryDirectory() as tmp:
    code = make_rmt_fixtures.export_code(a.source, tmp)
    sys.path[:0] = [code, os.path.join(code, "utils")]
    cuda, torch.version.cuda = torch.version.cuda, torch.version.cuda or "10.0"
    try:
      mt = importlib.import_module("mem_transformer")
    finally:
      torch.version.cuda = cuda
    batches = their_batches(code, torch)
    torch.manual_seed(SEED)
    model = mt.MemTransformerLM(**HPARAMS)
    with torch.no_grad():
      for name, p in model.named_parameters():
        if "layer_norm.weight" in name:
          p.fill_(1.0)
        elif "layer_norm.bias" in name:
          p.zero_()
        else:
          p.normal_(0.0, 0.02)
    out = {f"sd/{k}": v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS, eta_min=ETA_MIN)
    model.train()  # dropout 0
    losses = []
    for data_, target_ in batches:
      model.zero_grad()
      data_segs = torch.chunk(data_, data_.shape[0] // TGT_LEN)
      target_segs = torch.chunk(target_, target_.shape[0] // TGT_LEN)
      mem_tokens, mems, seg_losses = model.mem_tokens.repeat(1, data_.shape[1], 1), tuple(), []
      for data, target in zip(data_segs, target_segs):
        ret = model(data, target, *mems, mem_tokens=mem_tokens)
        mem_tokens, loss, mems = ret[0], ret[1], ret[2:]
        seg_losses.append(loss)
      loss = torch.cat(seg_losses)[-ANSWER_SIZE:].float().mean()
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
      opt.step()
      sched.step()
      losses.append(float(loss.item()))
  out["hparams"] = np.array(json.dumps(HPARAMS))
  out["inputs"] = np.stack([d.numpy() for d, _ in batches]).astype(np.int32)
  out["targets"] = np.stack([t.numpy() for _, t in batches]).astype(np.int32)
  out["loss"] = np.asarray(losses, np.float64)
  settings = dict(
      steps=STEPS, batch=B, pairs=PAIRS, lr=LR, eta_min=ETA_MIN, clip=CLIP, answer_size=ANSWER_SIZE
  )
  out.update({f"settings/{k}": np.asarray(v) for k, v in settings.items()})
  path = os.path.join(a.out, "rmt_trajectory.npz")
  np.savez_compressed(path, **out)
  print(f"wrote {path}: losses {losses[0]:.4f} -> {losses[-1]:.4f} over {STEPS} steps")
  return 0


if __name__ == "__main__":
  sys.exit(main())
