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
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tqdm
from etils import epath

from transformer_xl import errors
from transformer_xl.util import files, report

PER_TOKEN_UNITS = ("word", "subword")  # reported as perplexity; byte/char as bpc


def metric_name(unit: str) -> str:
  """ "bpc" for byte/char-level corpora, "ppl" for word and subword level."""
  return "ppl" if unit in PER_TOKEN_UNITS else "bpc"


def corpus_level(loss_nats: float, tokens: int, corpus: Any, split: str) -> dict:
  """Corpus-level numbers of a whole split's evaluation (as PG-19 reports them).

  ``bits_per_byte``: the split's total loss in bits over its UTF-8 bytes
  (``corpus.num_bytes``; comparable across tokenizers); ``word_ppl``:
  exp(total loss in nats / ``words``), the word-level perplexity of PG-19
  (Rae et al. 2020, Sec. 4), ``words`` being the whitespace-separated
  words of the split's raw text (``corpus.num_words``; for PTB and
  WikiText the tokens that are not ``<eos>``, so it is above the per-token
  ``ppl``, which counts ``<eos>``); and ``documents``: how many documents
  it has, where the corpus records them (one's own text,
  ``data.dataset="text"`` or ``"tfds:NAME"``).  Each only where the corpus
  knows it; empty when ``tokens`` is not the whole split
  (``train.eval_max_steps``).

  Args:
    loss_nats: mean loss per token, nats.
    tokens: tokens scored.
    corpus: the ``data.Corpus``.
    split: "valid" or "test".
  """
  out: dict = {}
  if tokens != corpus.splits[split].num_tokens:
    return out
  if corpus.num_bytes:
    out["bits_per_byte"] = float(loss_nats * tokens / corpus.num_bytes[split] / np.log(2.0))
  words = corpus.num_words[split] if getattr(corpus, "num_words", None) else 0
  if words:
    out["words"] = int(words)
    with np.errstate(over="ignore"):  # inf where it overflows (null in the JSON)
      out["word_ppl"] = float(np.exp(np.float64(loss_nats) * tokens / words))
  if corpus.documents:
    out["documents"] = int(corpus.documents[split].num_sentences)
  return out


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without its one process-wide change:
  its import sets ``os.environ["CRC32C_SW_MODE"]`` when unset (removed again)."""
  unset = "CRC32C_SW_MODE" not in os.environ
  from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

  if unset:
    os.environ.pop("CRC32C_SW_MODE", None)
  return SummaryWriter


def metric_value(loss_nats: float, unit: str) -> float:
  """bpc = loss / ln 2 (bits per character); ppl = exp(loss)."""
  return float(np.exp(loss_nats)) if unit in PER_TOKEN_UNITS else float(loss_nats / np.log(2.0))


def progress_bar(
    total: int, initial: int = 0, desc: str = "train", unit: str = "step"
) -> tqdm.tqdm:
  """A console progress bar over steps (or another ``unit``: documents) on
  stderr, shown on process 0 and only where stderr is a terminal (in a log
  file it would be carriage returns and redrawn bars beside the step lines)."""
  terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
  return tqdm.tqdm(
      total=total,
      initial=initial,
      disable=jax.process_index() != 0 or not terminal,
      desc=desc,
      unit=unit,
      dynamic_ncols=True,
  )


NonFiniteError = errors.NonFiniteError  # re-exported (transformer_xl.errors)


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
  """Strict JSON of ``values`` (``strict_json``; never NaN or Infinity)."""
  return json.dumps(strict_json(values), allow_nan=False, **kwargs)


def _parse_jsonl(text: str) -> tuple[list[dict], list[str]]:
  """(rows, bad lines) of a metrics.jsonl's text: a row is a strict-JSON
  object with a ``step``, on a line of its own ending with a newline; a
  last line without its newline (torn by a killed run) is bad even if it
  parses."""
  rows, bad = [], []
  lines = text.split("\n")
  for i, line in enumerate(lines):
    if not line:
      continue
    torn = i == len(lines) - 1  # no newline after it
    try:
      row = json.loads(line, parse_constant=_refuse_constant)
    except ValueError:
      row = None
    if torn or not (isinstance(row, dict) and isinstance(row.get("step"), int)):
      bad.append(line)
    else:
      rows.append(row)
  return rows, bad


def read_rows(workdir: str) -> list[dict]:
  """The complete rows of ``<workdir>/metrics.jsonl`` ([] without one)."""
  path = epath.Path(workdir) / "metrics.jsonl"
  return _parse_jsonl(path.read_text())[0] if path.exists() else []


def scalars_line(scalars: Mapping[str, float | None]) -> str:
  """``name=value, ...`` for the log: 4 significant digits, "null" for None."""
  return ", ".join(f"{k}={'null' if v is None else format(v, '.4g')}" for k, v in scalars.items())


def empty_validation_warning(step: int, metric: str, eval_max_steps: int) -> str:
  """The log's line for a validation during training that scored no token."""
  return (
      f"Warning: the validation at step {step} scored no token (loss and {metric} null): "
      f"its first train.eval_max_steps={eval_max_steps} segments hold no scored (answer) "
      "token; raise train.eval_max_steps, or set it to 0 for the whole split."
  )


def _kind(row: Mapping) -> frozenset[str]:
  """What a metrics row reports: the prefixes of its scalars' names (``train``, ``valid``)."""
  return frozenset(k.split("/", 1)[0] for k in row if k not in ("step", "nonfinite"))


def _refuse_constant(name: str):
  raise ValueError(f"not strict JSON: {name}")


class MetricWriter:
  """Scalars to TensorBoard (``<workdir>/tensorboard``, tensorboardX) and to
  ``<workdir>/metrics.jsonl`` (one strict-JSON object per line: step and
  scalars, non-finite values as null listed under ``"nonfinite"``), on
  process 0; a no-op elsewhere.  ``workdir`` may be local or gs://.

  A resumed run passes ``start_step`` (the restored checkpoint's step): the
  rows of later steps, written by the interrupted run and about to be
  redone, are removed from metrics.jsonl, and TensorBoard is told to drop
  its events of those steps (``purge_step``), so each step appears once.
  Lines that are not rows (a line torn by a killed run, anything that is
  not strict JSON) are moved to ``metrics.jsonl.corrupt`` with a note
  (``report.log``), and a row that repeats the step and kind of an earlier
  one (``train/`` scalars, ``valid/`` scalars) replaces it: a step keeps its
  training row and its validation row; the file is rewritten through a
  temporary file and a rename.
  """

  def __init__(self, workdir: str, start_step: int = 0):
    self._writer = self._jsonl = None
    if jax.process_index() == 0:
      SummaryWriter = _summary_writer_class()  # pylint: disable=invalid-name
      path = epath.Path(workdir) / "metrics.jsonl"
      if path.exists():
        text = path.read_text()
        rows, bad = _parse_jsonl(text)
        latest = {}  # (step, kind) -> its last row, at the place of its first
        for r in rows:
          if r["step"] <= start_step:
            latest[(r["step"], _kind(r))] = r
        kept = sorted(latest.values(), key=lambda r: r["step"])
        if bad:
          side = path.parent / (path.name + ".corrupt")
          with side.open("a") as f:
            f.write("".join(line + "\n" for line in bad))
          report.log(
              f"{path}: moved {len(bad)} line(s) that are not complete JSON rows (a run "
              f"killed while writing) to {side}."
          )
        if bad or kept != rows:
          files.write_text_atomic(
              path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept)
          )
      self._writer = SummaryWriter(
          logdir=str(epath.Path(workdir) / "tensorboard"),
          purge_step=start_step + 1 if start_step else None,
      )
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
