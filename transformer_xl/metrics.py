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
from typing import Any, Mapping

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


class NonFiniteError(RuntimeError):
  """A loss, gradient norm, parameter or result that is not finite; the
  message says where, what was kept and what to try."""


def strict_json(values: Mapping[str, Any]) -> dict:
  """``values`` with every non-finite float replaced by None, for strict JSON.

  Nested dicts are handled too.  When something was replaced, the result
  gets a ``"nonfinite"`` entry listing the replaced keys (dotted paths for
  nested ones), so a reader can tell a missing value from a NaN or an
  infinity.  ``json.dumps(strict_json(v), allow_nan=False)`` never fails on
  a float.
  """
  replaced = []

  def clean(obj, prefix):
    if isinstance(obj, Mapping):
      return {k: clean(v, f"{prefix}{k}.") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
      return [clean(v, prefix) for v in obj]
    if isinstance(obj, (float, np.floating)):
      if not np.isfinite(obj):
        replaced.append(prefix[:-1])
        return None
      return float(obj)
    if isinstance(obj, np.integer):
      return int(obj)
    return obj

  out = clean(dict(values), "")
  if replaced:
    out["nonfinite"] = replaced
  return out


def dumps(values: Mapping[str, Any], **kwargs) -> str:
  """Strict JSON of ``values`` (:func:`strict_json`; never NaN or Infinity)."""
  return json.dumps(strict_json(values), allow_nan=False, **kwargs)


def read_jsonl(path) -> list[dict]:
  """The rows of a metrics.jsonl, skipping a torn last line (a killed run)."""
  rows = []
  for line in epath.Path(path).read_text().splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and "step" in row:
      rows.append(row)
  return rows


class MetricWriter:
  """Scalars to TensorBoard (``<workdir>/tensorboard``, tensorboardX) and to
  ``<workdir>/metrics.jsonl`` (one strict-JSON object per line: step and
  scalars, non-finite values as null listed under ``"nonfinite"``), on
  process 0; a no-op elsewhere.  ``workdir`` may be local or gs://.

  A resumed run passes ``start_step`` (the restored checkpoint's step): the
  rows of later steps, written by the interrupted run and about to be
  redone, are removed from metrics.jsonl, and TensorBoard is told to drop
  its events of those steps (``purge_step``), so each step appears once.
  """

  def __init__(self, workdir: str, start_step: int = 0):
    self._writer = self._jsonl = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter
      path = epath.Path(workdir) / "metrics.jsonl"
      if path.exists():
        rows = read_jsonl(path)
        kept = [r for r in rows if r["step"] <= start_step]
        if len(kept) != len(rows) or path.read_text().count("\n") != len(rows):
          tmp = path.parent / (path.name + ".tmp")
          tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
          tmp.replace(path)
      self._writer = SummaryWriter(logdir=str(epath.Path(workdir) / "tensorboard"),
                                   purge_step=start_step + 1 if start_step else None)
      self._jsonl = path.open("a")

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Writes {name: value} at ``step`` (None values go to metrics.jsonl only)."""
    if self._writer is not None:
      for k, v in scalars.items():
        if v is not None:
          self._writer.add_scalar(k, v, step)
      self._writer.flush()
      self._jsonl.write(dumps({"step": step, **scalars}) + "\n")
      self._jsonl.flush()

  def close(self) -> None:
    """Flushes and closes the files."""
    if self._writer is not None:
      self._writer.close()
      self._jsonl.close()
