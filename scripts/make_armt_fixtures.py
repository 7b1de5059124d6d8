"""Writes tests/fixtures/armt_layer.npz by running the authors' ARMT layer code.

The Associative Recurrent Memory Transformer (Rodkin et al. 2024, arXiv
2407.04841) is implemented in RodkinIvan/associative-recurrent-memory-transformer
(PyTorch, Apache-2.0): ``modeling_amt/language_modeling.py``, whose
``AssociativeLayerWrapper`` wraps one layer of a HuggingFace model with an
associative memory: before the layer, every row reads ``phi(W_mq h)`` against
the matrix ``W_mem`` and its normaliser ``z`` (``associate``); after it, the
layer's outputs at the memory-token rows (the last ``num_mem_tokens``) write
into them with a delta rule (``update_mem``).  This script exports that file
from a checkout or a bare git mirror (``git archive HEAD``) to a temporary
directory, imports it (``wandb``, imported there and never called on this
path, is stubbed) and runs, for ``correction`` True and False, the wrapper
around a fixed toy layer (``out = tanh(h A)``, returned as a 1-tuple, as a
HuggingFace layer returns) over SEGMENTS segments of B = 2 rows, d_model 8,
d_mem 4 (d_key = 2 nu d_mem = 24, nu = 3), 3 memory tokens, the last
segment shorter (a ragged last segment).  ``W_mv``, which the authors
initialise to zeros (an untrained model reads 0), is set to random values so
that the reads carry something; the other projections keep torch's
initialisation under a fixed seed.

Recorded per case (``c`` = "corr" or "nocorr"; s = segment):

  {c}_x_s{s}           float32 [B, T_s, D], the segment's layer input
                       (memory-token rows last);
  {c}_read_s{s}        the read ``associate(x)`` added to it (zeros in segment
                       0, where the authors skip it);
  {c}_out_s{s}         the wrapper's output (the toy layer of x + read);
  {c}_W_mem_s{s}, {c}_z_s{s}  the matrix [B, d_key, D] and normaliser
                       [B, d_key] after the segment's write;
  {c}_loss             sum over segments of sum(out * cot), float64 scalar;
  {c}_cot_s{s}         the cotangent;
  {c}_grad_{name}      its gradient for each parameter (W_mq, W_mk, W_mv:
                       [out, in] as torch stores them; W_mb_weight [1, D],
                       W_mb_bias [1]) and for every segment's input
                       ({c}_grad_x_s{s}): the gradient flows through every
                       segment's write into the later reads, as theirs;
  W_mq, W_mk, W_mv, W_mb_weight, W_mb_bias, A   the parameters (shared by both
                       cases).

Usage:
  python scripts/make_armt_fixtures.py \\
      /work/.mirror/RodkinIvan+associative-recurrent-memory-transformer/repo [--out tests/fixtures]

Needs torch (CPU) besides this package's dependencies.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import types

import numpy as np

B, D, D_MEM, N_MEM = 2, 8, 4, 3
LENGTHS = (5, 5, 5, 4)  # rows per segment, memory tokens included; the last one ragged
SEED = 0


def export(checkout: str, into: str) -> str:
  """``modeling_amt/`` of ``checkout`` (a work tree or a bare mirror) under ``into``."""
  if os.path.isdir(os.path.join(checkout, "modeling_amt")):
    return checkout
  tar = subprocess.run(
      ["git", "--git-dir", checkout, "archive", "HEAD", "modeling_amt"],
      check=True,
      capture_output=True,
  ).stdout
  with tarfile.open(fileobj=io.BytesIO(tar)) as t:
    t.extractall(into, filter="data")
  return into


def load(root: str):
  """Their ``language_modeling`` module, ``wandb`` stubbed."""
  sys.modules.setdefault("wandb", types.ModuleType("wandb"))
  sys.path.insert(0, os.path.join(root, "modeling_amt"))
  import language_modeling  # noqa: E402  (the authors' file)

  return language_modeling


def run(lm, correction: bool, params: dict, xs: list, cots: list) -> dict:
  """One case: their wrapper over the segments; the arrays to record."""
  import torch

  class Toy(torch.nn.Module):

    def __init__(self, a):
      super().__init__()
      self.a = torch.nn.Parameter(torch.tensor(a))

    def forward(self, hidden_states):
      return (torch.tanh(hidden_states @ self.a),)

  wrapper = lm.AssociativeLayerWrapper(Toy(params["A"]), D, N_MEM, D_MEM, correction=correction)
  with torch.no_grad():
    for name in ("W_mq", "W_mk", "W_mv"):
      getattr(wrapper, name).weight.copy_(torch.tensor(params[name]))
    wrapper.W_mb.weight.copy_(torch.tensor(params["W_mb_weight"]))
    wrapper.W_mb.bias.copy_(torch.tensor(params["W_mb_bias"]))
  wrapper.zero_mem()
  out, rec = [], {}
  x_t = [torch.tensor(x, requires_grad=True) for x in xs]
  loss = torch.zeros((), dtype=torch.float64)
  for s, x in enumerate(x_t):
    read = torch.zeros_like(x) if wrapper.first_seg else wrapper.associate(x)
    o = wrapper(x)[0]
    rec[f"read_s{s}"] = read.detach().numpy()
    rec[f"out_s{s}"] = o.detach().numpy()
    rec[f"W_mem_s{s}"] = wrapper.W_mem.detach().numpy().copy()
    rec[f"z_s{s}"] = wrapper.z.detach().numpy().copy()
    loss = loss + (o.double() * torch.tensor(cots[s], dtype=torch.float64)).sum()
    out.append(o)
  loss.backward()
  rec["loss"] = np.float64(loss.item())
  for name in ("W_mq", "W_mk", "W_mv"):
    rec[f"grad_{name}"] = getattr(wrapper, name).weight.grad.numpy()
  rec["grad_W_mb_weight"] = wrapper.W_mb.weight.grad.numpy()
  rec["grad_W_mb_bias"] = wrapper.W_mb.bias.grad.numpy()
  for s, x in enumerate(x_t):
    rec[f"grad_x_s{s}"] = x.grad.numpy()
  return rec


# The whole-model case: HuggingFace's TransfoXLLMHeadModel wrapped by their
# AssociativeMemoryCell and AssociativeRecurrentWrapper.
HF_CONFIG = dict(
    vocab_size=24,
    cutoffs=[],
    d_model=16,
    d_embed=16,
    n_head=2,
    d_head=8,
    d_inner=32,
    div_val=1,
    pre_lnorm=False,
    n_layer=2,
    mem_len=0,
    clamp_len=-1,
    same_length=False,
    attn_type=0,
    untie_r=True,
    dropout=0.0,
    dropatt=0.0,
    tie_projs=[False],
    adaptive=True,
    init_std=0.3,
)
CELL = dict(num_mem_tokens=3, d_mem=4)
SEGMENT_SIZE = 4
TOTAL = 15  # tokens of a row: 3 full segments and a ragged one of 3


def shim(lm, transformers):
  """What their code needs of a TransfoXLLMHeadModel (their wrapper was
  written for GPT-2): the input embedding's ``embedding_dim`` and ``weight``
  (AdaptiveEmbedding has neither), a decoder layer called by keyword
  (``hidden_states=``, as their ``AssociativeLayerWrapper`` calls it) while
  TransfoXLModel calls it positionally with the relative positions, the
  batch-first layout their wrapper's einsums and ``out[0][:, -N:]`` assume
  (TransfoXLModel runs its layers time-first: the shim transposes around
  their wrapper and around the layer it wraps), and a
  model that ignores the ``use_cache``/``past_key_values``/``prev_attn_mask`` their recurrent
  wrapper always passes (and reads back as ``past_key_values``: the mems,
  None with mem_len 0).  Nothing of the computation changes."""
  from transformers.models.transfo_xl import modeling_transfo_xl as hf  # 4.35

  if getattr(hf, "_armt_shim", False):
    return hf
  hf._armt_shim = True
  emb = hf.AdaptiveEmbedding
  emb.embedding_dim = property(lambda self: self.d_embed)
  emb.weight = property(lambda self: self.emb_layers[0].weight)
  layer = hf.RelPartialLearnableDecoderLayer
  layer_forward = layer.forward
  t = lambda out: [out[0].transpose(0, 1).contiguous(), *out[1:]]  # [T, B, D] <-> [B, T, D]

  def layer_by_keyword(self, hidden_states, r, **kw):  # batch-first in and out
    return t(layer_forward(self, hidden_states.transpose(0, 1).contiguous(), r, **kw))

  layer.forward = layer_by_keyword
  wrapper_forward = lm.AssociativeLayerWrapper.forward

  def wrapper_positional(self, dec_inp, r, **kw):  # TransfoXLModel's call, time-first
    return t(wrapper_forward(self, hidden_states=dec_inp.transpose(0, 1).contiguous(), r=r, **kw))

  lm.AssociativeLayerWrapper.forward = wrapper_positional
  model_forward = hf.TransfoXLLMHeadModel.forward

  def forward(self, *args, use_cache=None, past_key_values=None, prev_attn_mask=None, **kw):
    return model_forward(self, *args, **kw)

  hf.TransfoXLLMHeadModel.forward = forward
  hf.TransfoXLLMHeadModelOutput.past_key_values = property(lambda self: self.mems)
  return hf


def run_model(lm, correction: bool, tokens: np.ndarray, seed: int) -> dict:
  """Their wrapper over a TransfoXLLMHeadModel: per-token NLLs (from their
  concatenated logits, the last position of a segment predicting the next
  segment's first token), the loss their wrapper computes, its gradients,
  and the state dict under their names."""
  import torch
  import transformers

  hf = shim(lm, transformers)
  torch.manual_seed(seed)
  base = hf.TransfoXLLMHeadModel(hf.TransfoXLConfig(**HF_CONFIG))
  cell = lm.AssociativeMemoryCell(
      base, layers_attr="transformer.layers", wrap_pos=False, correction=correction, **CELL
  )
  wrapper = lm.AssociativeRecurrentWrapper(cell, segment_size=SEGMENT_SIZE)
  with torch.no_grad():  # values that carry something (theirs start at zeros)
    g = torch.Generator().manual_seed(seed + 1)
    for layer in cell.layers:
      layer.W_mv.weight.copy_(torch.randn(layer.W_mv.weight.shape, generator=g) * 0.3)
  ids = torch.tensor(tokens, dtype=torch.long)
  out = wrapper(input_ids=ids, labels=ids)
  out["loss"].backward()
  logp = torch.log_softmax(out["logits"].detach(), -1)  # their logits are log-probabilities
  nll = -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
  rec = {
      "nll": nll.numpy(),
      "loss": np.float64(out["loss"].item()),
      "logits": out["logits"].detach().numpy(),
  }
  for name, t in wrapper.state_dict().items():
    rec[f"state/{name}"] = t.detach().numpy().copy()
  for name, prm in wrapper.named_parameters():
    if prm.grad is not None:
      rec[f"grad/{name}"] = prm.grad.numpy().copy()
  return rec


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("checkout", help="the authors' repository: a work tree or a bare mirror")
  p.add_argument(
      "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
  )
  a = p.parse_args(argv)
  import torch

  torch.manual_seed(SEED)
  rng = np.random.default_rng(SEED)
  with tempfile.TemporaryDirectory() as tmp:
    lm = load(export(a.checkout, tmp))
    probe = lm.AssociativeLayerWrapper(torch.nn.Identity(), D, N_MEM, D_MEM)
    params = {
        "W_mq": probe.W_mq.weight.detach().numpy().copy(),
        "W_mk": probe.W_mk.weight.detach().numpy().copy(),
        "W_mv": rng.normal(0, 0.5, (D, D)).astype(np.float32),  # theirs: zeros
        "W_mb_weight": probe.W_mb.weight.detach().numpy().copy(),
        "W_mb_bias": probe.W_mb.bias.detach().numpy().copy(),
        "A": rng.normal(0, 0.5, (D, D)).astype(np.float32),
    }
    assert not probe.W_mv.weight.detach().numpy().any()  # their initialisation: zeros
    xs = [rng.normal(0, 1, (B, t, D)).astype(np.float32) for t in LENGTHS]
    cots = [rng.normal(0, 1, (B, t, D)).astype(np.float32) for t in LENGTHS]
    arrays = dict(params)
    for case, correction in (("corr", True), ("nocorr", False)):
      rec = run(lm, correction, params, xs, cots)
      arrays.update({f"{case}_{k}": v for k, v in rec.items()})
      for s, (x, c) in enumerate(zip(xs, cots)):
        arrays[f"{case}_x_s{s}"], arrays[f"{case}_cot_s{s}"] = x, c
    tokens = rng.integers(0, HF_CONFIG["vocab_size"], size=(B, TOTAL))
    model_arrays = {"tokens": tokens.astype(np.int32)}
    for case, correction in (("corr", True), ("nocorr", False)):
      rec = run_model(lm, correction, tokens, SEED)
      model_arrays.update({f"{case}/{k}": v for k, v in rec.items()})
  os.makedirs(a.out, exist_ok=True)
  for name, data in (("armt_layer.npz", arrays), ("armt_model.npz", model_arrays)):
    path = os.path.join(a.out, name)
    np.savez_compressed(path, **data)
    print(f"wrote {path}: {len(data)} arrays")
  return 0


if __name__ == "__main__":
  sys.exit(main())
