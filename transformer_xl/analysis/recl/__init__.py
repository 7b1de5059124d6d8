r"""Relative effective context length, RECL (Dai et al. 2019, Sec. 4.3, Appendix C).

    python -m transformer_xl.analysis.recl --workdirs=W1,W2,... --split=valid \
        --context_lengths=16,32,48,64,80 --r=0.1,0.5,1.0 --out=DIR \
        [--delta=16] [--threshold=0.01] [--names=a,b,...] [--max_tokens=N]

RECL is defined on a *model group* M = {m_1, ..., m_N} (Table 8 compares the
models of one group, which share a parameter budget), not on one model.  The
definitions, exactly as Appendix C writes them (losses in nats):

* (C.1) ``l_i(c, t) = -log P_{m_i}(x_t | x_{t-1}, ..., x_{t-c})``: the loss
  of model m_i on the t-th token of the corpus with a context length c;
* (C.2) ``b(c, t) = min_{i=1..N} l_i(c, t)``: the baseline, the best
  short-context loss of the group at t;
* (C.3) ``T`` = the top-r positions t with the largest b(c, t) (r in
  (0, 1]: "the comparison constrained to the top-r hard examples");
* (C.4) ``f_i(c, c') = 1/|T| * sum_{t in T} min(b(c, t), l_i(c', t))``:
  the relative loss of m_i w.r.t. the group, for c' >= c: only losses
  below the common baseline count;
* (C.5) ``g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)``:
  the relative gain (relative perplexity reduction);
* (C.6) RECL of m_i, with a step size Delta: (1) set the initial short
  length c and c' = c + Delta; (2) if g_i(c, c') < 0.01 return RECL = c;
  otherwise set c = c', c' = c + Delta and go to (2).

Figure 3 shows the unnormalised relative perplexity gains
exp f_i(c, c) - exp f_i(c, c') for the pairs (c, c') of the walk at r = 0.1
(here: one panel per r given); Figure 4 the ordinary perplexity
exp(mean_t l_i(c, t)) against c (bpc for byte and character corpora).

Where Appendix C leaves a detail open, this module decides (and says so):

* |T| = ceil(r * n) of the n scored tokens (at least 1; r = 1 takes every
  token); ties in b(c, t) are broken by stream order, earlier first.
* The walk (C.6) starts at the first of ``--context_lengths``.  With
  ``--delta`` it visits c_0, c_0 + Delta, c_0 + 2 Delta, ... (each must be
  evaluated); without it, every evaluated length in order (the same walk for
  evenly spaced lengths, where Delta is their spacing).  ``--threshold`` is
  the 0.01 of (C.6).
* If the gain stays >= the threshold up to the last evaluated length c_K,
  the walk cannot continue: RECL is reported as c_K and marked a lower bound
  (">=c_K" in the table, ``"lower_bound": true`` in the JSON).

How l_i(c, t) is measured (token t's context is the c inputs before it;
the split's first token sees the corpus's boundary symbol, and a token near
the start of the split sees all of the fewer tokens before it, for every
model alike):

* a segment model (``eval.method="segments"``, Transformer-XL and the other
  recurrent or memory-using variants): its attention length c, as the paper
  evaluates, i.e. ``same_length=True`` with ``eval.mem_len = c``: every
  query attends to exactly c keys, its own input x_{t-1} and the c - 1
  before it (``attention_ops.attention_mask``).  The cached states of the lower
  layers were computed with their own context, so information can flow from
  further back through the layers (up to n_layer * c tokens): that is the
  point of the recurrence.  One row (``--segment_rows=1``, the default), so
  that no token but the split's first c has a truncated context (more rows
  would start each row with an empty memory); the eval tgt_len and clamp_len
  of the workdir's config are kept (``--tgt_len`` overrides the former).
* a sliding-window model (the workdir's config says ``eval.method=
  "sliding"``, the vanilla Transformer of Al-Rfou et al. 2018): a fresh
  pass over a window of c inputs that ends with x_{t-1}, one token scored per
  window (``eval.window = c``, ``eval.stride = 1``), ``--window_batch``
  windows a step (default: the config's ``eval.global_batch``).

For a one-layer model with relative attention both give the same l(c, t)
(tested).  The per-token NLLs come from ``evaluate.Evaluator.token_nll``.

Outputs in ``--out``: ``recl.json`` (every curve: per model and c the mean
loss and ppl/bpc; per r the walk, f_i(c, c), f_i(c, c'), g_i(c, c'), the
unnormalised gains, |T| and RECL), ``losses.npz`` (l_i(c, t) as float32
[N, C, n], the names and lengths, to recompute anything),
``fig3_relative_gains.png``, ``fig4_perplexity.png``; the Table 8 style
table is printed (and stored in the JSON).  Bad input (a malformed or
missing flag, a missing workdir, an empty group, r outside (0, 1], lengths
not strictly increasing, a walk off the evaluated lengths, workdirs of
different corpora) is one ``error: ...`` line and exit status 2, before
anything is compiled.

One role per module: this package's ``__init__`` measures (``make_request``
checks the settings, ``load_members`` the group, ``member_losses`` scores a
model, ``run`` does it all and writes the outputs) and formats the tables;
``plots.py`` draws Figures 3 and 4 with matplotlib; ``__main__.py`` is the
command line (absl flags); the arithmetic of Appendix C is
``transformer_xl.analysis.relative_gain``.  From Python::

    from transformer_xl.analysis import recl

    request = recl.make_request(["W1", "W2"], [16, 32, 48], "DIR", r=[0.1, 1.0])
    result = recl.run(request)  # recl.json's contents; the files are in DIR

The paper gives no code for RECL; the reference implementation
(kimiyoung/transformer-xl) has none either.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl import errors
from transformer_xl.analysis.recl import plots

# The definitions of Appendix C (pure numpy arithmetic) live in relative_gain.py.
from transformer_xl.analysis.relative_gain import DEFAULT_THRESHOLD, mean_losses, recl, walk_indices
from transformer_xl.util import report


def format_table(names: Sequence[str], rs: Sequence[float], results: dict) -> str:
  """Table 8 of the paper as markdown: one row per model, RECL (tokens) at
  each r (">=c" for a lower bound).

  Args:
    names: the N model names.
    rs: the ratios, in the column order.
    results: r -> the dict of ``recl`` at that r (keys as in ``rs``).

  Returns:
    The table, lines joined by newlines.
  """
  rows = ["| model | " + " | ".join(f"r={r}" for r in rs) + " |", "|---|" + "---:|" * len(rs)]
  for i, name in enumerate(names):
    cells = [
        (">=" if results[r]["lower_bound"][i] else "") + str(results[r]["recl"][i]) for r in rs
    ]
    rows.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


def format_curves(
    names: Sequence[str],
    methods: Sequence[str],
    lengths: Sequence[int],
    values_NxC: np.ndarray,
    metric: str,
) -> str:
  """Figure 4 as a markdown table.

  Args:
    names: per model, its name.
    methods: per model, its eval method.
    lengths: the C context lengths (tokens).
    values_NxC: ``metric`` per model and length, float [N, C].
    metric: "ppl" or "bpc" (the column label).

  Returns:
    The table, lines joined by newlines.
  """
  rows = [
      f"| model ({metric}) | method | " + " | ".join(f"c={c}" for c in lengths) + " |",
      "|---|---|" + "---:|" * len(lengths),
  ]
  for name, method, v in zip(names, methods, values_NxC):
    rows.append(f"| {name} | {method} | " + " | ".join(f"{x:.2f}" for x in v) + " |")
  return "\n".join(rows)


# --------------------------------------------------------------------------- #
# The request: the command's settings, checked; the group's workdirs, per-token losses.

UsageError = errors.UsageError  # re-exported (transformer_xl.errors)


def _numbers(items: Sequence, kind: Callable, flag: str) -> list:
  """``items`` (strings or numbers; empty strings dropped) as ``kind``s.

  Raises:
    UsageError: an item that is not a ``kind``.
  """
  items = [s.strip() if isinstance(s, str) else s for s in items]
  items = [s for s in items if s != ""]
  try:
    return [kind(s) for s in items]
  except ValueError:
    text = ",".join(map(str, items))
    raise UsageError(f"--{flag}={text!r}: expected a comma list of {kind.__name__}s.") from None


@dataclasses.dataclass(frozen=True)
class Request:
  """The checked settings of a RECL measurement (no file read yet, nothing
  compiled); ``make_request`` builds one.  The fields are the command's
  flags (``python -m transformer_xl.analysis.recl --help``)."""

  workdirs: list  # the group's workdirs
  names: list  # one model name per workdir, all different
  rs: list  # the ratios r, in (0, 1]
  lengths: list  # the context lengths c (tokens), strictly increasing
  walk: list  # the indices into ``lengths`` of the walk (C.6)
  split: str
  out: str  # the output directory
  delta: int | None
  threshold: float
  max_tokens: int
  segment_rows: int
  window_batch: int
  tgt_len: int
  data_dir: str | None
  manual_dir: str | None


def make_request(
    workdirs: Sequence[str],
    context_lengths: Sequence,
    out: str,
    names: Sequence[str] = (),
    split: str = "valid",
    r: Sequence = (0.1, 0.5, 1.0),
    delta: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_tokens: int = 0,
    segment_rows: int = 1,
    window_batch: int = 0,
    tgt_len: int = 0,
    data_dir: str | None = None,
    manual_dir: str | None = None,
) -> Request:
  """Checks every setting that can be checked without reading a file.

  Args:
    workdirs: the model group's workdirs (trained or converted).
    context_lengths: the context lengths c (ints, or strings of them),
      strictly increasing.
    out: the output directory.
    names: one model name per workdir (default: the workdirs' last path
      components).
    split: "train", "valid" or "test".
    r: the ratios r of (C.3) (floats, or strings of them), each in (0, 1].
    delta: the step Delta of (C.6) in tokens (None: each evaluated length
      to the next).
    threshold: the relative-gain threshold of (C.6).
    max_tokens: score only the first N tokens of the split (0 = all).
    segment_rows: rows of segment models.
    window_batch: windows per step of sliding-window models (0 = the
      config's eval.global_batch).
    tgt_len: segment length of segment models (0 = the config's
      eval.tgt_len).
    data_dir: overrides the workdirs' data.data_dir (None: keep it).
    manual_dir: overrides the workdirs' data.manual_dir (None: keep it).

  Returns:
    The Request.

  Raises:
    UsageError: an empty group, names not matching the workdirs or repeated,
      a split other than train/valid/test, r outside (0, 1], lengths not
      strictly increasing (or < 2 of them, or < 1), a delta walk off the
      lengths, a threshold < 0, max_tokens / window_batch / tgt_len < 0,
      segment_rows < 1.
  """
  workdirs = _numbers(workdirs, str, "workdirs")
  if not workdirs:
    raise UsageError(
        "--workdirs is empty: RECL is defined on a group of models (Appendix C); "
        "give one or more workdirs, comma-separated."
    )
  names = _numbers(names, str, "names") or [w.rstrip("/").split("/")[-1] for w in workdirs]
  if len(names) != len(workdirs):
    raise UsageError(f"--names has {len(names)} names for {len(workdirs)} workdirs.")
  if len(set(names)) != len(names):
    raise UsageError(f"model names must differ: {names}; pass --names=a,b,...")
  if split not in ("train", "valid", "test"):
    raise UsageError(f"--split={split!r}: use train, valid or test.")
  rs = _numbers(r, float, "r")
  if not rs or any(not 0.0 < x <= 1.0 for x in rs):
    shown = ",".join(map(str, r))
    raise UsageError(f"--r={shown!r}: every r must be in (0, 1] (the top-r ratio of Appendix C).")
  lengths = _numbers(context_lengths, int, "context_lengths")
  try:
    walk = walk_indices(lengths, delta)
  except ValueError as err:
    raise UsageError(f"--context_lengths/--delta: {err}") from None
  if not threshold >= 0.0:
    raise UsageError(f"--threshold={threshold} must be >= 0 (the paper's is 0.01).")
  for flag, value in (
      ("max_tokens", max_tokens),
      ("window_batch", window_batch),
      ("tgt_len", tgt_len),
  ):
    if value < 0:
      raise UsageError(f"--{flag}={value} must be >= 0.")
  if segment_rows < 1:
    raise UsageError(f"--segment_rows={segment_rows} must be >= 1.")
  return Request(
      workdirs=workdirs,
      names=names,
      rs=rs,
      lengths=lengths,
      walk=walk,
      split=split,
      out=out,
      delta=delta,
      threshold=threshold,
      max_tokens=max_tokens,
      segment_rows=segment_rows,
      window_batch=window_batch,
      tgt_len=tgt_len,
      data_dir=data_dir,
      manual_dir=manual_dir,
  )


@dataclasses.dataclass
class Member:
  """One model of the group: its workdir, saved config and architecture."""

  name: str
  workdir: str
  config: Any  # ml_collections.ConfigDict, the training run's config.json
  model_cfg: Any  # models.ModelConfig
  unit: str

  @property
  def method(self) -> str:
    """ "segments" or "sliding": how the workdir's config evaluates."""
    return self.config.eval.method


def context_config(
    config, method: str, c: int, segment_rows: int = 1, window_batch: int = 0, tgt_len: int = 0
):
  """A copy of ``config`` whose ``eval`` section gives every token a context
  of c tokens (see the module docstring).

  Args:
    config: the workdir's config (not modified).
    method: "segments" (same_length, mem_len = c) or "sliding" (window c,
      stride 1).
    c: the context length, >= 1.
    segment_rows: rows of the segment evaluation (``eval.global_batch``).
    window_batch: windows per step of the sliding evaluation; 0 = the
      config's ``eval.global_batch``.
    tgt_len: segment length for "segments"; 0 = the config's eval.tgt_len.

  Returns:
    ml_collections.ConfigDict.
  """
  cfg = config.copy_and_resolve_references()
  if method == "sliding":
    cfg.eval.update(
        method="sliding",
        window=int(c),
        stride=1,
        global_batch=window_batch or cfg.eval.global_batch,
    )
  else:
    cfg.eval.update(
        method="segments",
        mem_len=int(c),
        same_length=True,
        tgt_len=tgt_len or cfg.eval.tgt_len,
        global_batch=segment_rows,
    )
  return cfg


def load_members(request: Request) -> list:
  """Reads each workdir's config.json and model_config.json and checks the
  group (one corpus, valid eval configs at every length).  Nothing is
  compiled.

  Raises:
    UsageError: a workdir or its files missing; workdirs of different
      corpora or vocabularies; a config that does not validate at some c.
  """
  import jax
  from etils import epath

  from transformer_xl import default_config
  from transformer_xl.run import workdir as wd

  members = []
  for name, w in zip(request.names, request.workdirs):
    if not epath.Path(w).is_dir():
      raise UsageError(f"workdir {w} does not exist.")
    for f in ("config.json", "model_config.json"):
      if not (epath.Path(w) / f).exists():
        raise UsageError(
            f"{epath.Path(w) / f} does not exist: --workdirs takes the workdirs of "
            "training runs (or of converted checkpoints)."
        )
    try:
      config = wd.load_config(w)
      model_cfg, unit = wd.load_model_config(w)
    except FileNotFoundError as err:
      raise UsageError(str(err)) from None
    ckpt = epath.Path(w) / "checkpoints"
    if not ckpt.is_dir() or not any(p.name.isdigit() for p in ckpt.iterdir()):
      raise UsageError(
          f"workdir {w} has no checkpoint in {ckpt}: train (or convert) into it first."
      )
    members.append(Member(name, w, config, model_cfg, unit))
  datasets = {m.name: (m.config.data.dataset, m.model_cfg.n_token) for m in members}
  if len(set(datasets.values())) > 1:
    raise UsageError(
        f"the group's models must share a corpus and vocabulary (RECL compares "
        f"losses token by token); got {datasets}."
    )
  for m in members:
    for c in request.lengths:
      cfg = context_config(
          m.config,
          m.method,
          c,
          request.segment_rows,
          request.window_batch,
          request.tgt_len,
      )
      try:
        default_config.validate(cfg, jax.device_count())
      except default_config.ConfigError as err:
        raise UsageError(f"{m.workdir} at c={c}: " + " ".join(str(err).split())) from None
  return members


def load_group_corpus(member: Member, request: Request):
  """The group's corpus (from the first member's data config, with the
  --data_dir / --manual_dir overrides), the split cut to --max_tokens.

  Raises:
    data.DataError: the corpus cannot be found or built.
  """
  from transformer_xl import data

  data_cfg = member.config.data.to_dict()
  if request.data_dir is not None:
    data_cfg["data_dir"] = request.data_dir
  if request.manual_dir is not None:
    data_cfg["manual_dir"] = request.manual_dir
  corpus = data.load_configured(data_cfg)
  n = request.max_tokens
  source = corpus.splits[request.split]
  if n and n < source.num_tokens:
    splits = dict(corpus.splits)
    splits[request.split] = data.ArraySource(source.read(0, n))
    corpus = dataclasses.replace(corpus, splits=splits)
  return corpus


def member_losses(
    member: Member,
    corpus,
    split: str,
    lengths: Sequence[int],
    segment_rows: int = 1,
    window_batch: int = 0,
    tgt_len: int = 0,
) -> np.ndarray:
  """l(c, t) of one model: float32 [C, n], nats, at each of ``lengths``.

  Restores the workdir's latest parameters once, on the mesh of its config,
  and runs ``evaluate.Evaluator.token_nll`` with ``context_config`` at
  every c (one compilation per c), reporting each c's loss
  (``util.report.log``).

  Raises:
    FileNotFoundError: no checkpoint.
  """
  from transformer_xl import sharding
  from transformer_xl.inference import evaluate
  from transformer_xl.run import run_dir

  mesh = sharding.make_mesh(member.config.mesh.shape, member.config.mesh.axis_names)
  step, params = run_dir.restore_params(member.workdir, member.model_cfg, mesh)
  out_CxT = np.zeros((len(lengths), corpus.splits[split].num_tokens), np.float32)
  for k, c in enumerate(lengths):
    t0 = time.perf_counter()
    cfg = context_config(member.config, member.method, c, segment_rows, window_batch, tgt_len)
    nll_T = evaluate.Evaluator(cfg, member.model_cfg, corpus, mesh).token_nll(params, split)
    if np.any(np.isnan(nll_T)):
      raise RuntimeError(f"{member.name} c={c}: some tokens were not scored.")
    out_CxT[k] = nll_T
    report.log(
        f"{member.name} (step {step}, {member.method}) c={c}: loss "
        f"{float(np.mean(nll_T, dtype=np.float64)):.4f} nats over {nll_T.size:,} tokens, "
        f"{time.perf_counter() - t0:.1f} s"
    )
  return out_CxT


def run(request: Request) -> dict:
  """Loads the group, scores the split at every length, computes RECL at
  every r, writes the outputs into ``request.out`` and returns the JSON dict
  (its ``table`` and ``curves``: the results as text, which the command
  prints).  Progress and the files written are reported
  (``util.report.log``).

  Raises:
    UsageError: see ``load_members``; ImportError: no matplotlib.
  """
  plots.pyplot()  # fail before any compilation if the plots cannot be made
  from etils import epath

  from transformer_xl import data
  from transformer_xl.model import attention
  from transformer_xl.run import metrics

  members = load_members(request)
  try:
    corpus = load_group_corpus(members[0], request)
  except data.DataError as err:
    raise UsageError(" ".join(str(err).split())) from None
  n_tokens = corpus.splits[request.split].num_tokens
  report.log(
      f"RECL: {len(members)} models, {request.split} split of {corpus.name}, {n_tokens:,} tokens, "
      f"context lengths {request.lengths}, r {request.rs}"
  )
  losses_NxCxT = np.stack(
      [
          member_losses(
              m,
              corpus,
              request.split,
              request.lengths,
              request.segment_rows,
              request.window_batch,
              request.tgt_len,
          )
          for m in members
      ]
  )
  results = {
      r: recl(losses_NxCxT, request.lengths, r, request.threshold, request.delta)
      for r in request.rs
  }
  names = request.names
  methods = [m.method for m in members]
  unit = members[0].unit
  metric = metrics.metric_name(unit)
  loss_NxC = mean_losses(losses_NxCxT)
  value_NxC = np.vectorize(lambda x: metrics.metric_value(float(x), unit))(loss_NxC)
  table = format_table(names, request.rs, results)
  curves = format_curves(names, methods, request.lengths, value_NxC, metric)
  out = {
      "paper": "Dai et al. 2019, Sec. 4.3, Table 8, Appendix C",
      "split": request.split,
      "dataset": corpus.name,
      "tokens": n_tokens,
      "max_tokens": request.max_tokens,
      "context_lengths": request.lengths,
      "delta": request.delta,
      "threshold": request.threshold,
      "r": request.rs,
      "metric": metric,
      "models": [
          {
              "name": m.name,
              "workdir": m.workdir,
              "method": m.method,
              "n_layer": m.model_cfg.n_layer,
              **attention.describe(m.model_cfg),
              "loss_nats": loss_NxC[i].tolist(),
              metric: value_NxC[i].tolist(),
          }
          for i, m in enumerate(members)
      ],
      "results": {str(r): results[r] for r in request.rs},
      "table": table,
      "curves": curves,
  }
  out_dir = epath.Path(request.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "recl.json").write_text(json.dumps(out, indent=2))
  buf = io.BytesIO()
  np.savez_compressed(
      buf,
      losses_NxCxT=losses_NxCxT.astype(np.float32),
      names=np.array(names),
      context_lengths=np.array(request.lengths),
  )
  (out_dir / "losses.npz").write_bytes(buf.getvalue())
  (out_dir / plots.FIGURE_3).write_bytes(plots.plot_gains(names, request.rs, results))
  (out_dir / plots.FIGURE_4).write_bytes(
      plots.plot_perplexity(names, request.lengths, value_NxC, metric)
  )
  report.log(f"wrote {out_dir / 'recl.json'}, losses.npz, {plots.FIGURE_3}, {plots.FIGURE_4}")
  return out


def describe(out: Mapping[str, Any]) -> str:
  """The results of ``run`` as the command prints them: the RECL table
  (Table 8) and the metric by context length (Figure 4)."""
  walk = out["results"][str(out["r"][0])]["walk"]
  return (
      f"RECL (Table 8 of Dai et al. 2019; threshold {out['threshold']:g}, walk {walk}):\n"
      f"{out['table']}\n\n{out['metric']} by context length (Figure 4):\n{out['curves']}"
  )
