"""Writes tests/fixtures/lm_rmt_*.npz by running the authors' RMT code.

The Recurrent Memory Transformer's authors (Bulatov et al. 2022, arXiv
2207.06881) implemented it in a fork of the reference Transformer-XL PyTorch
code (booydar/LM-RMT, ``pytorch/mem_transformer.py``).  This script exports
that file (and the ``utils`` it imports) from their checkout or from a bare
git mirror of it (``HEAD``) to a temporary directory, imports it, builds tiny
``MemTransformerLM`` models (dropout 0) and runs several consecutive segments
carrying the XL cache and the memory tokens exactly as their ``train.py``'s
``evaluate`` does (the first segment reads ``model.mem_tokens.repeat(1, B,
1)``, each next one the tokens the previous one wrote).  Each fixture holds:

  hparams          the constructor's arguments, JSON (str);
  sd/<name>        the state dict, float32, their names and layouts;
  inputs_SxBxT     int32, the segments' inputs, batch-major;
  targets_SxBxT    int32, the next tokens;
  nll_SxBxT        float32, their per-token NLL (nats) per segment;
  written_SxBxNxD  float32, the tokens each segment wrote (their
                   ``mem_tokens_write``, batch-major);
  grad<s>/<name>   (``GRAD_CASES``) float32, the gradient of segment s's
                   summed NLL (s = 0, 1) for each parameter (tied ones
                   once).

tests/test_memory_tokens.py converts each (transformer_xl.convert.rmt) and
compares our model's NLLs and written tokens.  ``rmt_bptt_depth1`` holds the
gradient of backpropagation through one earlier segment (``run_bptt_case``;
tests/test_bptt.py).  Needs torch (CPU).

Usage:
  python scripts/make_rmt_fixtures.py /work/.mirror/booydar+LM-RMT/repo \
      [--out tests/fixtures]
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

# name -> the constructor's arguments beyond BASE.
CASES = {
    "lm_rmt_zero": dict(num_mem_tokens=0),  # their code without tokens: Transformer-XL
    "lm_rmt_mem": dict(mem_len=6),  # the cache full after one segment (E = 9 > 6)
    "lm_rmt_nomem": dict(mem_len=0),
    # mlen 0, 8, 12, 12; N = 3: a read token sees one two positions after it
    "lm_rmt_not_at_end": dict(mem_len=12, mem_at_end=False, num_mem_tokens=3),
    "lm_rmt_read_cache": dict(mem_len=12, read_mem_from_cache=True),  # mlen 0, 9, 12, 12
    "lm_rmt_same_length": dict(mem_len=6, same_length=True),
    "lm_rmt_adaptive": dict(
        mem_len=7,
        cutoffs=[8, 16],
        div_val=2,
        d_embed=16,
        tie_projs=[False, True, True],
        clamp_len=5,
        n_token=24,
        num_mem_tokens=3,
        read_mem_from_cache=True,
    ),
}
BASE = dict(
    n_token=23,
    n_layer=2,
    n_head=2,
    d_model=16,
    d_head=8,
    d_inner=24,
    dropout=0.0,
    dropatt=0.0,
    tie_weight=True,
    d_embed=None,
    div_val=1,
    tie_projs=[False],
    pre_lnorm=False,
    tgt_len=5,
    ext_len=0,
    mem_len=6,
    num_mem_tokens=2,
    read_mem_from_cache=False,
    mem_at_end=True,
    cutoffs=[],
    same_length=False,
    attn_type=0,
    clamp_len=-1,
)
N_SEGMENTS, BATCH = 4, 2
# Cases whose fixture also holds the gradients of the summed NLL of segments
# 0 (the learned tokens read) and 1 (the written ones, detached as their
# train.py does) with respect to every parameter (``grad<s>/<name>``).
GRAD_CASES = ("lm_rmt_not_at_end",)


def export_code(source: str, dest: str) -> str:
  """Their ``pytorch/`` directory under ``dest``: copied from a checkout, or
  ``git archive HEAD pytorch`` of a (bare) repository.  Returns its path."""
  if os.path.exists(os.path.join(source, "pytorch", "mem_transformer.py")):
    return os.path.join(source, "pytorch")
  tar = subprocess.run(
      ["git", f"--git-dir={source}", "archive", "HEAD", "pytorch"],
      check=True,
      capture_output=True,
  ).stdout
  with tarfile.open(fileobj=io.BytesIO(tar)) as t:
    t.extractall(dest, filter="data")
  return os.path.join(dest, "pytorch")


def init_weights(model, torch, gen) -> None:
  """Every parameter N(0, 0.1) (LayerNorm weights 1 + N(0, 0.1)): their
  ``r_w_bias``/``r_r_bias`` are uninitialised ``torch.Tensor``s, and larger
  weights than the 0.02 of training make the parity test sharper."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen) * 0.1
      p.copy_(1.0 + noise if "layer_norm.weight" in name else noise)


def run_case(mt, torch, name: str, hp: dict, seed: int) -> dict:
  gen = torch.Generator().manual_seed(seed)
  kwargs = {k: v for k, v in hp.items()}
  model = mt.MemTransformerLM(**kwargs)
  init_weights(model, torch, gen)
  if "mem_tokens" in dict(model.named_parameters()):  # their init: one vector, N times
    with torch.no_grad():
      v = torch.randn((1, 1, hp["d_model"]), generator=gen)
      model.mem_tokens.copy_(
          v.expand_as(model.mem_tokens) + 0.1 * torch.randn(model.mem_tokens.shape, generator=gen)
      )  # distinct tokens: a sharper test
  model.eval()
  # Their adaptive softmax returns the NLLs grouped by cluster unless
  # keep_order (the sum is the same): per-token NLLs in the tokens' order.
  model.crit.keep_order = True
  t = hp["tgt_len"]
  stream = torch.randint(0, hp["n_token"], (BATCH, N_SEGMENTS * t + 1), generator=gen)
  inputs, targets, nlls, written = [], [], [], []
  mems = tuple()
  n = hp["num_mem_tokens"]
  mem_tokens = model.mem_tokens.repeat(1, BATCH, 1) if n else None  # train.py's evaluate()
  with torch.no_grad():
    for s in range(N_SEGMENTS):
      data = stream[:, s * t : (s + 1) * t].t().contiguous()  # [T, B]
      target = stream[:, s * t + 1 : (s + 1) * t + 1].t().contiguous()
      ret = model(data, target, *mems, mem_tokens=mem_tokens)
      if n:
        mem_tokens, loss, mems = ret[0], ret[1], ret[2:]
        written.append(mem_tokens.permute(1, 0, 2).numpy())
      else:
        loss, mems = ret[0], ret[1:]
        written.append(np.zeros((BATCH, 0, hp["d_model"]), np.float32))
      inputs.append(data.t().numpy())
      targets.append(target.t().numpy())
      nlls.append(loss.t().numpy())
  grads = {}
  if name in GRAD_CASES:
    mems, mem_tokens = tuple(), model.mem_tokens.repeat(1, BATCH, 1)
    for s in range(2):
      model.zero_grad()
      data = torch.from_numpy(inputs[s]).t().contiguous()
      target = torch.from_numpy(targets[s]).t().contiguous()
      ret = model(data, target, *mems, mem_tokens=mem_tokens)
      ret[1].sum().backward()
      mem_tokens, mems = ret[0].detach(), ret[2:]
      for k, p in model.named_parameters():  # tied tensors once, under their first name
        g = torch.zeros_like(p) if p.grad is None else p.grad  # None: no path to the loss
        grads[f"grad{s}/{k}"] = g.numpy().astype(np.float32).copy()
  out = {
      **grads,
      "hparams": np.array(json.dumps(hp)),
      "inputs_SxBxT": np.stack(inputs).astype(np.int32),
      "targets_SxBxT": np.stack(targets).astype(np.int32),
      "nll_SxBxT": np.stack(nlls).astype(np.float32),
      "written_SxBxNxD": np.stack(written).astype(np.float32),
  }
  for k, v in model.state_dict().items():
    out[f"sd/{k}"] = v.detach().numpy().astype(np.float32)
  print(f"{name}: nll mean {out['nll_SxBxT'].mean():.4f}, {len(model.state_dict())} tensors")
  return out


def run_bptt_case(mt, torch, hp: dict, seed: int) -> dict:
  """Backpropagation through one earlier segment (their ``train.py`` with
  ``--mem_backprop_depth 1``, no ``--bptt_bp``): segment 0 runs without a
  gradient from the learned tokens; then the window of segments 1 and 2: the
  stored cache and tokens of segment 1 are replayed (the tokens as their
  evident intent, ``prev_mem_tokens[0]``: their ``mem_tokens.values = ...``
  sets an attribute and leaves the tokens as they were, which here are the
  same), segment 2 reads the replay's cache and written tokens, and the mean
  NLL of segment 2 is backpropagated.  Saves the state dict, the three
  segments, that loss and the gradient of every parameter
  (``grad/<state dict name>``)."""
  gen = torch.Generator().manual_seed(seed)
  model = mt.MemTransformerLM(**hp)
  init_weights(model, torch, gen)
  model.train()  # dropout 0: as eval, with gradients
  t, b = hp["tgt_len"], BATCH
  stream = torch.randint(0, hp["n_token"], (b, 3 * t + 1), generator=gen)
  seg = lambda s, o=0: stream[:, s * t + o : (s + 1) * t + o].t().contiguous()
  with torch.no_grad():
    ret = model(seg(0), seg(0, 1), mem_tokens=model.mem_tokens.repeat(1, b, 1))
  stored_tokens, stored_mems = ret[0].detach(), ret[2:]
  model.zero_grad()
  mem_tokens = stored_tokens.clone()  # prev_mem_tokens[0]
  ret = model(seg(1), seg(1, 1), *stored_mems, mem_tokens=mem_tokens)
  mem_tokens, mems = ret[0], ret[2:]
  ret = model(seg(2), seg(2, 1), *mems, mem_tokens=mem_tokens)
  loss = ret[1].float().mean()
  loss.backward()
  out = {
      "hparams": np.array(json.dumps(hp)),
      "stream_BxL": stream.numpy().astype(np.int32),
      "loss": np.array(loss.item(), np.float32),
  }
  for k, v in model.state_dict().items():
    out[f"sd/{k}"] = v.detach().numpy().astype(np.float32)
  for k, p in model.named_parameters():
    grad = torch.zeros_like(p) if p.grad is None else p.grad  # unused: mem_tokens
    out[f"grad/{k}"] = grad.numpy().astype(np.float32)
  print(f"rmt_bptt_depth1: loss {loss.item():.4f}")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("source", help="their checkout, or a (bare) git repository of it")
  ap.add_argument(
      "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
  )
  args = ap.parse_args(argv)
  import torch

  torch.set_default_dtype(torch.float32)
  os.makedirs(args.out, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    code = export_code(args.source, tmp)
    paths = [code, os.path.join(code, "utils")]  # theirs: sys.path.append('utils')
    sys.path[:0] = paths
    try:
      # Their utils/proj_adaptive_softmax.py parses torch.version.cuda at import
      # (CUDA_MAJOR/MINOR, used nowhere else): None on a CPU build.
      cuda, torch.version.cuda = torch.version.cuda, torch.version.cuda or "10.0"
      try:
        mt = importlib.import_module("mem_transformer")
      finally:
        torch.version.cuda = cuda
      for i, (name, extra) in enumerate(CASES.items()):
        hp = {**BASE, **extra}
        np.savez_compressed(
            os.path.join(args.out, name + ".npz"), **run_case(mt, torch, name, hp, i)
        )
      np.savez_compressed(  # mem_len 6 < E = 9: the cache is full from segment 1 on
          os.path.join(args.out, "rmt_bptt_depth1.npz"),
          **run_bptt_case(mt, torch, {**BASE, "mem_len": 6}, len(CASES)),
      )
    finally:
      for p in paths:
        sys.path.remove(p)
  return 0


if __name__ == "__main__":
  sys.exit(main())
