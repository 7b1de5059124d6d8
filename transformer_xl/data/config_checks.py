"""The checks of the run config's data section (``default_config.validate``).

Which dataset, and which of the data fields apply to it: the text-file
fields (own text, "tfds:NAME": ``text_settings``) and the synthetic tasks'
(``synthetic``), each refused where it does not apply; a synthetic task's
own settings and the segments and evaluation it needs.  Each function
returns one message per problem, naming the key and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformer_xl import data
from transformer_xl.data import babilong, example_corpus, synthetic, text_settings


def data_problems(d: Any, nonfinite: set[str], default: Callable[[str], Any]) -> list[str]:
  """Problems of the data section ``d`` (a ConfigDict): the dataset name,
  and the text-file fields set only for data.dataset="text" (or "tfds:NAME")
  and the synthetic tasks' only for theirs.

  Args:
    d: the run config's ``data`` section.
    nonfinite: the dotted names already refused as NaN or inf (each counts
      as its default here).
    default: a dotted key's default (``default_config``'s).

  Returns:
    One message per problem, naming ``data.<key>`` and the fix; [] if none.
  """
  text = {
      k: (d.get(k, default(f"data.{k}")) if f"data.{k}" not in nonfinite else default(f"data.{k}"))
      for k in data.TEXT_FIELDS
  }
  documents = d.get("documents", "stream")
  if documents not in ("stream", "reset"):
    return [
        f"data.documents={documents!r}: use 'stream' (memory flows across documents) or "
        "'reset' (no attention across a document boundary)."
    ]
  synthetic_changed = [
      k for k in synthetic.FIELDS if d.get(k, default(f"data.{k}")) != default(f"data.{k}")
  ]
  babilong_values = {  # a value refused as NaN or inf counts as its default here
      k: d.get(k, default(f"data.{k}")) if f"data.{k}" not in nonfinite else default(f"data.{k}")
      for k in babilong.FIELDS
  }
  babilong_changed = [k for k, v in babilong_values.items() if v != default(f"data.{k}")]
  if babilong.is_babilong(d.dataset):
    others = synthetic_changed + [
        k
        for k, v in text.items()
        if v != default(f"data.{k}") and k not in babilong.TEXT_FIELDS_READ
    ]
    if others:
      return [f"data.{', data.'.join(others)} do not apply to {d.dataset!r}: remove them."]
    return babilong.settings_problems(
        babilong.BabilongSettings.from_data_config({**d.to_dict(), **babilong_values})
    )
  if babilong_changed:
    return [
        f"data.{', data.'.join(babilong_changed)} apply only to BABILong "
        f"(data.dataset='babilong:qaN'), not to {d.dataset!r}: remove them."
    ]
  if synthetic.is_synthetic(d.dataset):
    text_changed = [k for k, v in text.items() if v != default(f"data.{k}")]
    if text_changed:
      return [
          f"data.{', data.'.join(text_changed)} apply only to your own text "
          f"(data.dataset={data.TEXT!r} or 'tfds:NAME'), not to {d.dataset!r}: remove them."
      ]
    return []  # the task's own settings: synthetic_problems
  if synthetic_changed:
    return [
        f"data.{', data.'.join(synthetic_changed)} apply only to the synthetic tasks "
        f"(data.dataset='synthetic:TASK'), not to {d.dataset!r}: remove them."
    ]
  if d.dataset == data.TEXT or d.dataset.startswith(data.TFDS_PREFIX):
    tfds_name = d.dataset[len(data.TFDS_PREFIX) :] if d.dataset != data.TEXT else ""
    if d.dataset != data.TEXT and not tfds_name:
      return [f"data.dataset={d.dataset!r}: name the tfds dataset, e.g. 'tfds:pg19'."]
    return text_settings.settings_problems(text_settings.TextSettings(**text, tfds_name=tfds_name))
  if documents == "reset":
    return [
        f"data.documents='reset' needs documents, which the built-in corpus "
        f"{d.dataset!r} does not have: use 'stream', or data.dataset={data.TEXT!r}."
    ]
  if d.dataset == data.CONVERTED:  # refused where a corpus is loaded (load_configured)
    return []
  if d.dataset not in data.CORPUS_NAMES:
    return [
        f"data.dataset={d.dataset!r}: choose one of {sorted(data.CORPUS_NAMES)}, "
        f"{data.TEXT!r} for your own text files (data.train_files, ...), "
        "'tfds:NAME' for a tfds text dataset, one of "
        f"{', '.join(repr(synthetic.PREFIX + t) for t in synthetic.TASKS)}, or "
        "'babilong:qa1' ... 'babilong:qa20'."
    ]
  changed = [k for k, v in text.items() if v != default(f"data.{k}")]
  if changed:
    verb = "applies" if len(changed) == 1 else "apply"
    return [
        f"data.{', data.'.join(changed)} {verb} only to data.dataset={data.TEXT!r} (your "
        f"own text files), not to the built-in corpus {d.dataset!r}: remove them, or set "
        f"--config.data.dataset={data.TEXT}."
    ]
  return []


def synthetic_problems(config: Any, default: Callable[[str], Any]) -> list[str]:
  """A synthetic task's settings (``synthetic.settings_problems``), its
  segment lengths (each must divide the example length: an example is whole
  segments) and the evaluation it needs ("segments", split by split); []
  when ``config`` (the whole run config, a ConfigDict) has no synthetic task.
  ``default``: a dotted key's default."""
  d = config.data
  if babilong.is_babilong(d.dataset):
    settings: Any = babilong.Layout(
        d.dataset[len(babilong.PREFIX) :], d.babilong_sample_size + 1, 1
    )
    if babilong.settings_problems(babilong.BabilongSettings.from_data_config(d)):
      return []  # data_problems says what
  elif synthetic.is_synthetic(d.dataset):
    settings = synthetic.TaskSettings.from_data_config(d)
    defaults = synthetic.TaskSettings(
        task=settings.task,
        **{f: default(f"data.{k}") for k, f in synthetic.FIELDS.items()},
    )
    problems = synthetic.settings_problems(settings, defaults)
    if problems:
      return problems
  else:
    return []
  problems = example_corpus.segment_problems(
      settings, {"model.tgt_len": config.model.tgt_len, "eval.tgt_len": config.eval.tgt_len}
  )
  depth, t = config.train.get("mem_backprop_depth", 0), config.model.tgt_len
  if babilong.is_babilong(d.dataset) and depth and not problems:
    segments = settings.example_len // t
    if depth + 1 != segments or not config.train.get("bptt_bp", False):
      problems.append(
          f"train.mem_backprop_depth={depth}: BABILong trains on whole examples as the "
          f"synthetic tasks: set train.mem_backprop_depth={segments - 1} (its {segments} "
          f"segments of {t}) and train.bptt_bp=True, or 0."
      )
  if config.eval.method != "segments":
    problems.append(
        f"eval.method={config.eval.method!r} does not score {d.dataset!r} (whole examples, "
        "each from an empty memory): set --config.eval.method=segments."
    )
  if config.eval.get("documents", "split") == "whole":
    problems.append(
        f"eval.documents={config.eval.documents!r} needs documents; {d.dataset!r} scores "
        "whole examples already: set --config.eval.documents=split."
    )
  return problems
