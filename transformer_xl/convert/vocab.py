"""Vocabularies: a released model's symbols mapped onto our corpus's ids.

``--vocab`` (the released model's symbols, one per line) and ``--dataset``
map the model's rows onto our corpus's ids by symbol (enwik8: the
reference's decimal byte values onto byte ids; text8: its "_" onto " ");
ids the model never saw get a zero embedding and a softmax bias of
``UNSEEN_BIAS``, and model symbols we lack are dropped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.names import flatten_params, unflatten_params
from transformer_xl.util.report import log

# Softmax bias given to vocabulary entries the converted model never saw
# (--vocab mapping): exp(-1e4) underflows to 0 in float32, so such a token
# gets probability 0 without producing inf or NaN anywhere.
UNSEEN_BIAS = -1e4


def read_vocab(path: str) -> list[str]:
  """A reference vocabulary file: one symbol per line, id = line number.

  Like the reference's ``Vocab._build_from_file``, the symbol is the first
  whitespace-separated field of the line (so ``"word count"`` lines work).
  The released TF models keep their vocabulary in ``data/<corpus>/cache.pkl``
  (a pickled reference ``Corpus``); write it out with the reference code,
  e.g. ``"\\n".join(corpus.vocab.idx2sym)``.

  Raises:
    ConvertError: a missing or unreadable file, one that is not UTF-8
      text, an empty file, an empty line, or a repeated symbol (the message
      names the file and line).
  """
  fix = "pass the model's vocabulary with --vocab: UTF-8 text, one symbol per line"
  if not os.path.exists(path):
    raise ConvertError(f"vocabulary {path} does not exist; {fix}.")
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as err:
    raise ConvertError(f"cannot read the vocabulary {path} ({describe(err)}); {fix}.") from None
  try:
    lines = raw.decode("utf-8").splitlines()
  except UnicodeDecodeError as err:
    line_no = raw[: err.start].count(b"\n") + 1
    raise ConvertError(
        f"vocabulary {path} is not UTF-8 text (line {line_no}, byte {err.start}: "
        f"{err.reason}); {fix}."
    ) from None
  if not lines:
    raise ConvertError(f"vocabulary {path} is empty; {fix}.")
  vocab, seen = [], {}
  for n, line in enumerate(lines, 1):
    fields = line.split()
    if not fields:
      raise ConvertError(
          f"{path}:{n}: empty line; one symbol per line expected (delete the "
          "line, or check that this is the model's vocabulary file)."
      )
    if fields[0] in seen:
      raise ConvertError(
          f"{path}:{n}: symbol {fields[0]!r} repeats line {seen[fields[0]]}; "
          "each symbol must appear once (check that this is the model's "
          "vocabulary file)."
      )
    seen[fields[0]] = n
    vocab.append(fields[0])
  return vocab


def check_dataset_name(name: str) -> None:
  """Raises ConvertError unless ``name`` is one of ``data.CORPUS_NAMES`` (no data read)."""
  from transformer_xl import data

  if name not in data.CORPUS_NAMES:
    raise ConvertError(f"dataset={name!r}: choose one of {list(data.CORPUS_NAMES)}.")


def dataset_vocab(
    name: str,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    verify_checksums: bool = True,
) -> tuple[list[str], str]:
  """(our vocabulary, unit) of a corpus of ``data.CORPUS_NAMES``.

  enwik8 (256 byte values, id = byte) and text8 (space + a..z) are fixed and
  need no data; the others come from the prepared dataset
  (``data.load_corpus`` with these arguments, which prepares it first if
  needed).

  Raises:
    ConvertError: unknown name; data.DataError: the corpus cannot be built.
  """
  from transformer_xl import data

  check_dataset_name(name)
  if name == "enwik8":
    return [chr(i) for i in range(256)], "byte"
  if name == "text8":
    from transformer_xl.data import tokenizers

    return list(tokenizers.TEXT8_VOCAB), "char"
  corpus = data.load_corpus(
      name,
      data_dir=data_dir,
      manual_dir=manual_dir,
      download=download,
      verify_checksums=verify_checksums,
  )
  return list(corpus.vocab), corpus.unit


def _our_symbol(dataset: str | None, symbol: str) -> str | None:
  """A reference vocabulary symbol in our corpus's spelling (None: no match).

  enwik8: the reference writes each byte as its decimal value
  (``prep_enwik8.py``); ours is ``chr(byte)``.  text8: the reference writes
  spaces as "_" (``prep_text8.py``); ours is " ".  Word corpora: the same.
  """
  if dataset == "enwik8":
    ok = symbol.isascii() and symbol.isdigit() and int(symbol) < 256
    return chr(int(symbol)) if ok else None
  if dataset == "text8":
    return " " if symbol == "_" else symbol
  return symbol


def map_vocab(
    ref_vocab: Sequence[str], our_vocab: Sequence[str], dataset: str | None = None
) -> tuple[np.ndarray, dict]:
  """Which reference id each of our token ids takes its parameters from.

  Args:
    ref_vocab: the released model's symbols (id = index).
    our_vocab: our corpus's symbols (id = index).
    dataset: our corpus name, for the symbol spellings (``_our_symbol``).

  Returns:
    (ref_of_ours, report): int64 [len(our_vocab)], the reference id or -1
    (unseen); report = {"matched", "ref_unmatched" (reference symbols with
    no id here), "ours_unseen" (our ids without a reference symbol)}, lists
    of symbols.

  Raises:
    ConvertError: two reference symbols map onto the same id.
  """
  index = {s: j for j, s in enumerate(our_vocab)}
  ref_of_ours = np.full(len(our_vocab), -1, np.int64)
  ref_unmatched = []
  for r, s in enumerate(ref_vocab):
    j = index.get(_our_symbol(dataset, s))
    if j is None:
      ref_unmatched.append(s)
    elif ref_of_ours[j] >= 0:
      raise ConvertError(
          f"reference symbols {ref_vocab[ref_of_ours[j]]!r} and {s!r} both map "
          f"onto our id {j} ({our_vocab[j]!r})."
      )
    else:
      ref_of_ours[j] = r
  report = {
      "matched": int((ref_of_ours >= 0).sum()),
      "ref_unmatched": ref_unmatched,
      "ours_unseen": [our_vocab[j] for j in np.flatnonzero(ref_of_ours < 0)],
  }
  return ref_of_ours, report


def remap_vocab(
    params: Mapping[str, Any], cfg, ref_of_ours: np.ndarray, unseen_bias: float = UNSEEN_BIAS
) -> tuple[dict, Any]:
  """Moves the vocabulary rows of a model onto another vocabulary.

  Row j of every embedding table, softmax weight and softmax bias becomes
  the reference model's row ``ref_of_ours[j]``.  Rows of unseen ids (-1)
  get an embedding (and softmax weight) of zeros and a softmax bias of
  ``unseen_bias``, so the model never predicts them.  Reference rows no id
  maps to are dropped, so the softmax renormalises over the others.  With
  cutoffs (adaptive input/softmax) every id must stay in its cluster.

  Args:
    params: our parameter tree for ``cfg`` (reference vocabulary).
    cfg: ModelConfig of the reference model.
    ref_of_ours: int [V_ours] (``map_vocab``).
    unseen_bias: softmax bias of unseen ids.

  Returns:
    (params, cfg) for n_token = V_ours.

  Raises:
    ConvertError: cutoffs not below V_ours, or a symbol that would change
      cluster.
  """
  from transformer_xl.model import adaptive

  n_ours = len(ref_of_ours)
  if cfg.cutoffs and cfg.cutoffs[-1] >= n_ours:
    raise ConvertError(f"cutoffs={list(cfg.cutoffs)} do not fit our vocabulary of {n_ours}.")
  ref_bounds = adaptive.cluster_bounds(cfg.n_token, cfg.cutoffs)
  our_bounds = adaptive.cluster_bounds(n_ours, cfg.cutoffs)
  ref_cluster = np.searchsorted(np.asarray(cfg.cutoffs, np.int64), ref_of_ours, side="right")
  our_cluster = np.searchsorted(np.asarray(cfg.cutoffs, np.int64), np.arange(n_ours), side="right")
  moved = np.flatnonzero((ref_of_ours >= 0) & (ref_cluster != our_cluster))
  if moved.size:
    raise ConvertError(
        f"{moved.size} symbols would change adaptive-softmax cluster (cutoffs "
        f"{list(cfg.cutoffs)}), e.g. our ids {moved[:5].tolist()} from reference "
        f"ids {ref_of_ours[moved[:5]].tolist()}; the vocabularies are ordered "
        "too differently to map."
    )
  flat = dict(flatten_params(params))

  def remap(a: np.ndarray, lo: int, hi: int, ref_lo: int, fill: float) -> np.ndarray:
    src = ref_of_ours[lo:hi]
    out = np.full((hi - lo,) + a.shape[1:], fill, np.float32)
    ok = src >= 0
    out[ok] = a[src[ok] - ref_lo]
    return out

  for path in list(flat):
    name = path.rsplit("/", 1)[-1]
    if not any(name.startswith(p) for p in ("emb_layers_", "out_weight_", "out_bias_")):
      continue
    i = int(name.rsplit("_", 1)[-1])
    fill = unseen_bias if name.startswith("out_bias_") else 0.0
    if cfg.div_val == 1:
      flat[path] = remap(np.asarray(flat[path]), 0, n_ours, 0, fill)
    else:
      flat[path] = remap(
          np.asarray(flat[path]), our_bounds[i], our_bounds[i + 1], ref_bounds[i], fill
      )
  return unflatten_params(flat), dataclasses.replace(cfg, n_token=n_ours)


def describe_vocab_map(rep: dict, n_ref: int, n_ours: int, dataset: str, bias: float) -> None:
  """Prints what a ``map_vocab`` report means for the converted model.

  Args:
    rep: the report of ``map_vocab``.
    n_ref: the size of the model's vocabulary.
    n_ours: the size of our vocabulary.
    dataset: our corpus name (enwik8 gets a note on the newline byte).
    bias: the softmax bias of unseen ids (``UNSEEN_BIAS``).
  """
  log(
      f"Vocabulary: matched {rep['matched']} of the model's {n_ref} symbols onto {dataset}'s "
      f"{n_ours} ids."
  )
  if rep["ref_unmatched"]:
    log(
        f"  {len(rep['ref_unmatched'])} model symbols have no id in {dataset} and are dropped "
        "(the softmax renormalises over the rest): "
        f"{rep['ref_unmatched'][:10]}{' ...' if len(rep['ref_unmatched']) > 10 else ''}"
    )
  if rep["ours_unseen"]:
    shown = [repr(s) for s in rep["ours_unseen"][:12]]
    log(
        f"  {len(rep['ours_unseen'])} of our ids were never seen by the model: zero embedding, "
        f"softmax bias {bias:g} (probability ~0): {', '.join(shown)}"
        f"{' ...' if len(rep['ours_unseen']) > 12 else ''}"
    )
  if dataset == "enwik8" and "\n" in rep["ours_unseen"]:
    log(
        "  enwik8: the reference drops newline bytes (prep_enwik8.py turns byte 10 into a line "
        "break and its vocabulary reader discards line breaks), so the model has no symbol for "
        "byte 10; our enwik8 keeps them (the boundary symbol).  Every newline of our stream "
        f"costs ~{-bias:g} nats here: to compare with the paper's bpc, score the bytes with "
        "newlines removed (--mode=score on such a stream), which is the reference's stream."
    )
