r"""Writes tests/fixtures/armt_trajectory.npz: 200 optimizer steps of the ARMT authors' training.

The training-trajectory check of issue 60: the first STEPS optimizer steps
of ARMT on associative retrieval, as the authors' code trains it
(RodkinIvan/associative-recurrent-memory-transformer): their
``AssociativeRecurrentWrapper(AssociativeMemoryCell(...))`` around
HuggingFace's ``TransfoXLLMHeadModel`` (``scripts/make_armt_fixtures.py``'s
shim: their wrapper was written for GPT-2/NeoX, this package's backbone is
Transformer-XL), their ``ARDataset`` and ``collate_fn``
(``scripts/make_ar_fixtures.py``: keys and values of one symbol, PAIRS pairs,
one per segment of 4 tokens), and the step of their ``Trainer``
(``lm_experiments_tools/trainer.py``: ``optimizer.zero_grad()``, the
wrapper on ``input_ids``, ``labels``, ``labels_mask`` (the only arguments
of its forward the batch has besides an all-ones ``attention_mask``),
``loss.backward()``, ``clip_grad_value_`` (their ``--clip_grad_value
1.0``), ``optimizer.step()``, ``lr_scheduler.step()``) with their
optimizer: ``torch.optim.AdamW(model.parameters(), lr, weight_decay=1e-3)``
and ``get_linear_schedule_with_warmup(optimizer, STEPS // 10, 2 * STEPS)``
(their ``--num_warmup_steps $(($ITERS/10))``, ``--num_training_steps
$((ITERS*2))``).  Batches are read in order, as their unshuffled
DataLoader does; every segment is backpropagated (their ``k2`` = -1).

Recorded: ``input_ids`` [STEPS * B, L] (their batches back to back),
``labels_mask`` [STEPS * B, L], ``loss`` [STEPS] (float64 of their float32
loss at each step, before the update), ``state/<name>`` the wrapper's
initial state dict (their initialisation under torch.manual_seed(SEED),
W_mv zeros as theirs), ``final/<name>`` the memory's parameters after the
last step, and the settings (``settings/*``).

Usage:
  python scripts/make_armt_trajectory.py \
      /work/.mirror/RodkinIvan+associative-recurrent-memory-transformer/repo [--out tests/fixtures]

Needs torch (CPU), transformers 4.35 and tqdm.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import make_ar_fixtures  # noqa: E402  (the scripts beside this one)
import make_armt_fixtures  # noqa: E402

SEED = 0
STEPS = 200
B = 8
PAIRS = 3  # 4 segments of 4 tokens
LR = 1e-3
WEIGHT_DECAY = 1e-3
CLIP_VALUE = 1.0
HF_CONFIG = dict(
    make_armt_fixtures.HF_CONFIG, vocab_size=103, d_model=32, d_embed=32, d_head=16, d_inner=64,
    init_std=0.02,
)  # fmt: skip
CELL = dict(num_mem_tokens=2, d_mem=8)
SEGMENT = 4


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("checkout", help="the ARMT repository: a work tree or a bare mirror")
  p.add_argument(
      "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
  )
  a = p.parse_args(argv)
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  theirs = make_ar_fixtures.their_definitions(
      make_ar_fixtures.source(a.checkout), value_size=1, vary=False
  )
  torch.manual_seed(SEED)
  ds = theirs["ARDataset"](1, 1, sample_len=PAIRS, num_samples=STEPS * B)
  batches = [theirs["collate_fn"]([ds[i] for i in range(s * B, (s + 1) * B)]) for s in range(STEPS)]
  with tempfile.TemporaryDirectory() as tmp:
    lm = make_armt_fixtures.load(make_armt_fixtures.export(a.checkout, tmp))
    hf = make_armt_fixtures.shim(lm, transformers)
    torch.manual_seed(SEED)
    base = hf.TransfoXLLMHeadModel(hf.TransfoXLConfig(**HF_CONFIG))
    cell = lm.AssociativeMemoryCell(
        base, layers_attr="transformer.layers", wrap_pos=False, correction=True, **CELL
    )
    wrapper = lm.AssociativeRecurrentWrapper(
        cell, segment_size=SEGMENT, max_n_segments=PAIRS + 1, k2=-1
    )
    out = {f"state/{k}": v.detach().numpy().copy() for k, v in wrapper.state_dict().items()}
    opt = torch.optim.AdamW(wrapper.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sched = transformers.get_linear_schedule_with_warmup(opt, STEPS // 10, 2 * STEPS)
    wrapper.train()
    losses = []
    for batch in batches:
      opt.zero_grad()
      res = wrapper(
          input_ids=batch["input_ids"], labels=batch["labels"], labels_mask=batch["labels_mask"]
      )
      res["loss"].backward()
      torch.nn.utils.clip_grad_value_(wrapper.parameters(), CLIP_VALUE)
      opt.step()
      sched.step()
      losses.append(float(res["loss"].item()))
    for k, v in wrapper.state_dict().items():
      if ".W_m" in k or k == "memory_cell.memory":
        out[f"final/{k}"] = v.detach().numpy().copy()
  out["input_ids"] = np.concatenate([b["input_ids"].numpy() for b in batches]).astype(np.int32)
  out["labels_mask"] = np.concatenate([b["labels_mask"].numpy() for b in batches]).astype(np.int32)
  out["loss"] = np.asarray(losses, np.float64)
  settings = dict(
      steps=STEPS, batch=B, pairs=PAIRS, lr=LR, weight_decay=WEIGHT_DECAY, clip_value=CLIP_VALUE,
      segment=SEGMENT, **{f"cell_{k}": v for k, v in CELL.items()},
  )  # fmt: skip
  out.update({f"settings/{k}": np.asarray(v) for k, v in settings.items()})
  path = os.path.join(a.out, "armt_trajectory.npz")
  np.savez_compressed(path, **out)
  print(f"wrote {path}: losses {losses[0]:.4f} -> {losses[-1]:.4f} over {STEPS} steps")
  return 0


if __name__ == "__main__":
  sys.exit(main())
