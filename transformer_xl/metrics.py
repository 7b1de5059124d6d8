"""What a run reports, and where: metric names, console, TensorBoard, JSON lines.

Every process runs the same program; only process 0 prints or writes.
Losses are in nats per scored token; the corpus's unit decides the
reported metric: bits per character (bpc) for byte- and character-level
corpora, perplexity (ppl) for word-level ones (Dai et al. 2019, Sec. 4).

The writer is hand-written rather than clu's ``metric_writers``: clu's
TensorBoard writer needs TensorFlow at run time, which training does not
(tensorboardX writes the same event files).
"""
from __future__ import annotations

import json
from typing import Mapping

import jax
import numpy as np
import tqdm
from etils import epath


def metric_name(unit: str) -> str:
  """"bpc" for byte/char-level corpora, "ppl" for word level."""
  return "ppl" if unit == "word" else "bpc"


def metric_value(loss_nats: float, unit: str) -> float:
  """bpc = loss / ln 2 (bits per character); ppl = exp(loss)."""
  return float(np.exp(loss_nats)) if unit == "word" else float(loss_nats / np.log(2.0))


def log(msg: str) -> None:
  """Prints on process 0 only."""
  if jax.process_index() == 0:
    print(msg, flush=True)


def progress_bar(total: int, initial: int = 0, desc: str = "train") -> tqdm.tqdm:
  """A console progress bar over steps, shown on process 0 only."""
  return tqdm.tqdm(total=total, initial=initial, disable=jax.process_index() != 0, desc=desc,
                   unit="step", dynamic_ncols=True)


class MetricWriter:
  """Scalars to TensorBoard (``<workdir>/tensorboard``, tensorboardX) and to
  ``<workdir>/metrics.jsonl`` (one JSON object per line: step and scalars),
  on process 0; a no-op elsewhere.  ``workdir`` may be local or gs://."""

  def __init__(self, workdir: str):
    self._writer = self._jsonl = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter
      self._writer = SummaryWriter(logdir=str(epath.Path(workdir) / "tensorboard"))
      self._jsonl = (epath.Path(workdir) / "metrics.jsonl").open("a")

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Writes {name: value} at ``step``."""
    if self._writer is not None:
      for k, v in scalars.items():
        self._writer.add_scalar(k, v, step)
      self._writer.flush()
      self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
      self._jsonl.flush()

  def close(self) -> None:
    """Flushes and closes the files."""
    if self._writer is not None:
      self._writer.close()
      self._jsonl.close()
