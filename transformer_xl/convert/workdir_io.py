"""Workdirs: a reference checkpoint into a workdir of ours (export.py: back out).

A converted workdir holds ``config.json``, ``model_config.json`` and an orbax
checkpoint of a full ``train_state.TrainState`` at step 0, so that
``python -m transformer_xl.main --workdir=DIR --mode=eval|score`` (and
``--mode=train`` with a ``--config`` of the same model, which fine-tunes
from step 0) load it like a trained run.  This is the only module of the
converter that calls into the training code (``default_config``,
``train_state``, ``workdir``, ``sharding``, ``checkpointing``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl.convert import armt, rmt
from transformer_xl.convert.errors import ConvertError, one_line
from transformer_xl.convert.hparams import (
    check_hparams,
    expected_param_shapes,
    model_config_from_hparams,
    read_hparams,
)
from transformer_xl.convert.names import flatten_params, resolve_cluster_order, unflatten_params
from transformer_xl.convert.pytorch import (
    params_from_state_dict,
    read_state_dict,
    state_dict_format,
)
from transformer_xl.convert.tf import read_tf_checkpoint, state_dict_from_tf
from transformer_xl.convert.vocab import (
    UNSEEN_BIAS,
    check_dataset_name,
    dataset_vocab,
    describe_vocab_map,
    map_vocab,
    read_vocab,
    remap_vocab,
)
from transformer_xl.util.report import log


def one_device_mesh():
  """A (data, model) = (1, 1) mesh on the first device, for writing and reading workdirs."""
  import jax

  from transformer_xl import sharding

  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


def workdir_config(
    cfg,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    verify_checksums: bool = True,
    eval_tgt_len: int | None = None,
    eval_mem_len: int | None = None,
    eval_clamp_len: int | None = None,
    eval_same_length: bool | None = None,
    global_batch: int = 1,
    eval_global_batch: int = 1,
):
  """The validated ``config.json`` of a converted workdir (see ``write_workdir``).

  Needs no data and computes nothing, so the converter calls it before the
  long work (reading the checkpoint, preparing the corpus).  The model
  section does not depend on n_token, so a later vocabulary remap leaves it
  as it is.

  Raises:
    ConvertError: a setting ``default_config.validate`` refuses (e.g. a
      global batch < 1, eval lengths out of range), with its fix.
  """
  from transformer_xl import default_config

  config = default_config.get_config()
  default_config.set_model_config(config, cfg)
  e = config.eval
  e.tgt_len = cfg.tgt_len if eval_tgt_len is None else int(eval_tgt_len)
  e.mem_len = cfg.mem_len if eval_mem_len is None else int(eval_mem_len)
  e.clamp_len = cfg.clamp_len if eval_clamp_len is None else int(eval_clamp_len)
  e.same_length = cfg.same_length if eval_same_length is None else bool(eval_same_length)
  e.global_batch = int(eval_global_batch)
  config.train.global_batch = int(global_batch)
  from transformer_xl import data  # pylint: disable=import-outside-toplevel

  # Without --dataset no corpus names the ids: "converted" (refused where a corpus loads).
  config.data.dataset = dataset if dataset is not None else data.CONVERTED
  if data_dir is not None:
    config.data.data_dir = str(data_dir)
  if manual_dir is not None:
    config.data.manual_dir = str(manual_dir)
  config.data.download, config.data.verify_checksums = bool(download), bool(verify_checksums)
  try:
    default_config.validate(config, 1)
  except default_config.ConfigError as err:
    raise ConvertError(one_line(err)) from None
  return config


def check_new_workdir(workdir: str) -> None:
  """Checks, without orbax and before any long work, that ``workdir`` can
  receive a conversion: not a file, creatable and writable (local paths),
  and no checkpoint (a numbered directory under ``checkpoints/``) yet.

  Raises:
    ConvertError: a file, a path under a file or in a directory this
      process cannot write, or a workdir that already holds checkpoints.
  """
  from etils import epath

  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise ConvertError(f"--workdir={workdir} is a file; convert into a new or empty directory.")
  check_creatable(workdir, "--workdir")
  checkpoints = path / "checkpoints"
  steps = (
      sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
      if checkpoints.is_dir()
      else []
  )
  if steps:
    raise ConvertError(
        f"{workdir} already holds checkpoints (step {steps[-1]}); convert into "
        "an empty --workdir."
    )


def check_creatable(path: str, flag: str, file: bool = False) -> None:
  """ConvertError unless the nearest existing ancestor of the local ``path``
  (itself if it exists, unless ``file``: a file is overwritten) is a
  directory this process may write in."""
  if "://" in path:
    return
  existing = os.path.abspath(path)
  if file:
    existing = os.path.dirname(existing)
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ConvertError(
        f"{flag}={path} cannot be created: {existing} is a file; pass a path in a directory."
    )
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConvertError(
        f"{flag}={path} cannot be written: no permission to write in {existing}; "
        "pass a path in a directory you may write."
    )


def check_safetensors_name(flag: str, checkpoint: str) -> None:
  """``--from=safetensors`` / ``--to=safetensors`` name the format: ConvertError
  unless ``checkpoint`` ends in ``.safetensors`` (the format of a state dict
  file is always its extension's, ``state_dict_format``)."""
  if state_dict_format(checkpoint) == "safetensors":
    return
  if flag == "--from":
    raise ConvertError(
        f"--from=safetensors reads a .safetensors file but --checkpoint="
        f"{checkpoint} has another extension; pass the .safetensors file, or use "
        "--from=pytorch for .npz and torch files."
    )
  raise ConvertError(
      f"--to=safetensors writes a .safetensors file but --checkpoint="
      f"{checkpoint} has another extension; name it "
      f"{os.path.splitext(checkpoint)[0]}.safetensors, or use --to=pytorch for "
      ".npz and torch files."
  )


def _check_unit(unit: str | None) -> None:
  if unit is not None and unit not in ("byte", "char", "word"):
    raise ConvertError(f"unit={unit!r}: use byte, char or word.")


def write_workdir(
    workdir: str,
    params: Mapping[str, Any],
    cfg,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    verify_checksums: bool = True,
    unit: str = "word",
    eval_tgt_len: int | None = None,
    eval_mem_len: int | None = None,
    eval_clamp_len: int | None = None,
    eval_same_length: bool | None = None,
    global_batch: int = 1,
    eval_global_batch: int = 1,
):
  """Writes a workdir that ``transformer_xl.main`` loads like a trained run.

  Files: ``config.json`` (``default_config`` with ``model.*`` from cfg,
  ``eval.*`` from the arguments, defaulting to cfg's tgt_len, mem_len,
  clamp_len and same_length; ``data.*`` from the data arguments; train/eval
  global_batch), ``model_config.json`` (cfg with n_token, unit, dataset) and
  an orbax checkpoint at step 0 of a full ``train_state.TrainState``: the
  parameters, ``tx.init(params)`` for the config's optimizer, and an empty
  memory for ``global_batch`` rows, on a 1-device mesh.  The iterator state
  is ``{}`` (training starts the data from the beginning).

  Args:
    workdir: directory (created); must not hold checkpoints yet.
    params: parameter tree for cfg (nested dicts of arrays).
    cfg: ``models.ModelConfig``.
    dataset: our corpus name for ``data.dataset`` (None: keep the default).
    data_dir: ``data.data_dir`` (with the next three: where ``--mode=eval``
      finds the corpus).
    manual_dir: ``data.manual_dir``.
    download: ``data.download``.
    verify_checksums: ``data.verify_checksums``.
    unit: "byte", "char" or "word" (decides bpc vs ppl in reports).
    eval_tgt_len: ``eval.tgt_len`` (None: from cfg).
    eval_mem_len: ``eval.mem_len`` (None: from cfg).
    eval_clamp_len: ``eval.clamp_len`` (None: from cfg).
    eval_same_length: ``eval.same_length`` (None: from cfg).
    global_batch: ``train.global_batch`` (the saved memory has this many
      rows; keep it a multiple of the data-parallel devices that will load
      the workdir).
    eval_global_batch: ``eval.global_batch``.

  Returns:
    The written ``ml_collections.ConfigDict``.

  Raises:
    ConvertError: params that do not fit cfg, a workdir that is a file or
      already has checkpoints, or an invalid setting.
  """
  _check_unit(unit)
  config = workdir_config(
      cfg,
      dataset=dataset,
      data_dir=data_dir,
      manual_dir=manual_dir,
      download=download,
      verify_checksums=verify_checksums,
      eval_tgt_len=eval_tgt_len,
      eval_mem_len=eval_mem_len,
      eval_clamp_len=eval_clamp_len,
      eval_same_length=eval_same_length,
      global_batch=global_batch,
      eval_global_batch=eval_global_batch,
  )
  expected = expected_param_shapes(cfg)
  flat = flatten_params(params)
  bad = {
      p: (tuple(np.shape(flat[p])) if p in flat else None, s)
      for p, s in expected.items()
      if p not in flat or tuple(np.shape(flat[p])) != s
  }
  extra = sorted(set(flat) - set(expected))
  if bad or extra:
    raise ConvertError(
        f"params do not fit the model config: (got, expected) {bad}; unexpected {extra}."
    )

  check_new_workdir(workdir)
  before = set(os.listdir(workdir)) if os.path.isdir(workdir) else None
  os.makedirs(workdir, exist_ok=True)
  try:
    return _write_new_workdir(workdir, flat, cfg, config, unit, dataset)
  except BaseException:  # nothing half-written stays: what this call made goes
    _remove_written(workdir, before)
    raise


def _remove_written(workdir: str, before: set[str] | None) -> None:
  """Removes what ``write_workdir`` made in ``workdir``: the directory when it
  did not exist (``before`` None), else the entries not in ``before``."""
  import shutil

  if before is None:
    shutil.rmtree(workdir, ignore_errors=True)
    return
  for name in set(os.listdir(workdir)) - before:
    path = os.path.join(workdir, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.remove(path)


def _write_new_workdir(workdir, flat, cfg, config, unit, dataset):
  """``write_workdir``'s files, into a checked ``workdir``; returns the config."""
  from transformer_xl.model import models
  from transformer_xl.run import checkpointing
  from transformer_xl.run import workdir as wd
  from transformer_xl.training import train_state

  manager = checkpointing.make_manager(workdir)
  existing = manager.latest_step()
  if existing is not None:
    manager.close()
    raise ConvertError(
        f"{workdir} already holds checkpoints (step {existing}); convert into "
        "an empty --workdir."
    )
  state = train_state.create_train_state(
      models.TransformerXL(cfg),
      train_state.make_optimizer(config.train, cfg),
      config.train.global_batch,
      one_device_mesh(),
      params=unflatten_params({p: np.asarray(a, np.float32) for p, a in flat.items()}),
  )
  wd.save_config(workdir, config)
  wd.save_model_config(workdir, cfg, unit, dataset or "converted")
  checkpointing.save(
      manager,
      0,
      state,
      {},
      meta=wd.checkpoint_meta(cfg, unit, dataset or "converted", config.train.global_batch),
  )
  manager.close()
  return config


def convert_to_workdir(
    source: str,
    checkpoint: str,
    hparams: str | Mapping[str, Any],
    workdir: str,
    *,
    cluster_order: str = "auto",
    vocab: str | None = None,
    dataset: str | None = None,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    verify_checksums: bool = True,
    unit: str | None = None,
    unseen_bias: float = UNSEEN_BIAS,
    **workdir_kwargs,
) -> dict:
  """``--from=pytorch|safetensors|tf|armt``: a reference checkpoint into a workdir.

  Args:
    source: "pytorch" (a state dict file of any format,
      ``read_state_dict``: ``.npz``, ``.safetensors`` or torch, by its
      extension), "safetensors" (the same, but the file must end in
      ``.safetensors``), "tf" (``read_tf_checkpoint``; always forward
      cluster order) or "armt" (the state dict of ARMT's wrapper around
      HuggingFace's TransfoXL, any format "pytorch" reads, with
      ``hparams`` its three sections: ``convert/armt.py``).
    checkpoint: the file / TF checkpoint prefix.
    hparams: JSON path or dict (``load_hparams``); the LM-RMT fork's
      (``num_mem_tokens``, ``mem_at_end``, ``read_mem_from_cache`` among
      them: ``rmt.load_rmt_hparams``) make a model with memory tokens from
      the fork's state dict (``rmt.params_from_rmt_state_dict``; "pytorch"
      and "safetensors" only).
    workdir: output directory (``write_workdir``).
    cluster_order: for "pytorch" and "safetensors" (``params_from_state_dict``).
    vocab: the released model's vocabulary file (``read_vocab``); its
      rows are mapped onto ``dataset``'s vocabulary (``map_vocab``,
      ``remap_vocab``).  Without it, the ids are taken as they are (and
      must number our vocabulary's size when ``dataset`` is given).
    dataset: our corpus (``dataset_vocab``), also written to the
      config's ``data.dataset``.
    data_dir: ``data.data_dir`` of our corpus, likewise.
    manual_dir: ``data.manual_dir``, likewise.
    download: ``data.download``, likewise.
    verify_checksums: ``data.verify_checksums``, likewise.
    unit: "byte", "char" or "word"; default: the dataset's, else "word".
    unseen_bias: softmax bias of our ids the model never saw.
    **workdir_kwargs: eval_tgt_len, eval_mem_len, eval_clamp_len,
      eval_same_length, global_batch, eval_global_batch (``write_workdir``).

  Returns:
    A report: {"n_token", "params" (count), "vocab" (map_vocab report or None),
    "cluster_order"}.

  Raises:
    ConvertError: any invalid input (see the functions it calls).  Every
      check that needs neither the checkpoint nor the corpus (flags, the
      hparams, the vocabulary file, the workdir's settings and emptiness)
      comes before reading the checkpoint and preparing the corpus.
  """
  if source not in ("pytorch", "safetensors", "tf", "armt"):
    raise ConvertError(f"--from={source!r}: use pytorch, safetensors, tf or armt.")
  if source == "safetensors":
    check_safetensors_name("--from", checkpoint)
  if vocab is not None and dataset is None:
    raise ConvertError("--vocab needs --dataset (the vocabulary to map onto).")
  _check_unit(unit)
  if dataset is not None:
    check_dataset_name(dataset)
  if source == "armt":  # ARMT's wrapper around HuggingFace's TransfoXL (convert/armt.py)
    hp = armt.load_armt_hparams(hparams)
    cfg = armt.model_config_from_armt_hparams(hp)
    fork = False
  else:
    raw, where = read_hparams(hparams)
    if armt.is_armt_hparams(raw):
      raise ConvertError(
          f"{where} has ARMT's hparams (the sections {', '.join(armt.SECTIONS)}): their "
          "wrapper's checkpoints convert with --from=armt."
      )
    fork = rmt.is_rmt_hparams(raw)  # the LM-RMT fork's (memory tokens)
    if fork and source == "tf":
      raise ConvertError(
          f"{where} has the LM-RMT fork's hparams ({', '.join(sorted(rmt.RMT_HPARAMS))}), "
          "whose checkpoints are PyTorch state dicts: use --from=pytorch."
      )
    hp = rmt.load_rmt_hparams(hparams) if fork else check_hparams(raw, where)
    cfg = rmt.model_config_from_rmt_hparams(hp) if fork else model_config_from_hparams(hp)
  ref_vocab = None
  if vocab is not None:
    ref_vocab = read_vocab(vocab)
    if len(ref_vocab) != cfg.n_token:
      raise ConvertError(
          f"{vocab} has {len(ref_vocab)} symbols but hparams n_token="
          f"{cfg.n_token}; pass the vocabulary the model was trained with, or "
          "fix n_token."
      )
  workdir_config(
      cfg,
      dataset=dataset,
      data_dir=data_dir,
      manual_dir=manual_dir,
      download=download,
      verify_checksums=verify_checksums,
      **workdir_kwargs,
  )
  check_new_workdir(workdir)
  if source in ("pytorch", "safetensors", "armt"):
    state = read_state_dict(checkpoint)
    order = resolve_cluster_order(cluster_order, list(state))
    log(
        f"Read {len(state)} tensors from {checkpoint}"
        + (f"; adaptive-softmax cluster order: {order}." if cfg.cutoffs else ".")
    )
  else:
    variables = read_tf_checkpoint(checkpoint)
    log(f"Read {len(variables)} variables from the TF checkpoint {checkpoint}.")
    state, order = _naming(checkpoint, state_dict_from_tf, variables, hp, cfg), "forward"
    log(
        "  Note (TF): LayerNorm epsilon 1e-12 there, 1e-5 here; TF's same_length lets each "
        "query see mem_len + 1 keys (here mem_len, as in the PyTorch reference; with mem_len "
        ">= tgt_len, --eval_mem_len=<mem_len + 1> gives TF's attention span); TF starts from "
        "zero-filled memory, here from empty memory."
    )
  to_params = rmt.params_from_rmt_state_dict if fork else params_from_state_dict
  if source == "armt":
    to_params = armt.params_from_armt_state_dict
  params = _naming(checkpoint, to_params, state, cfg, order)
  report: dict[str, Any] = {"cluster_order": order, "vocab": None}
  our_unit = unit
  if dataset is not None:
    our_vocab, ds_unit = dataset_vocab(dataset, data_dir, manual_dir, download, verify_checksums)
    our_unit = unit or ds_unit
    if ref_vocab is not None:
      ref_of_ours, vrep = map_vocab(ref_vocab, our_vocab, dataset)
      params, cfg = remap_vocab(params, cfg, ref_of_ours, unseen_bias)
      report["vocab"] = vrep
      describe_vocab_map(vrep, len(ref_vocab), len(our_vocab), dataset, unseen_bias)
    elif len(our_vocab) != cfg.n_token:
      raise ConvertError(
          f"hparams n_token={cfg.n_token} but {dataset} has a vocabulary of "
          f"{len(our_vocab)}: pass the model's vocabulary file with --vocab."
      )
    else:
      log(f"No --vocab: taking the model's ids as {dataset}'s ids (same size, {cfg.n_token}).")
  our_unit = our_unit or "word"
  write_workdir(
      workdir,
      params,
      cfg,
      dataset=dataset,
      data_dir=data_dir,
      manual_dir=manual_dir,
      download=download,
      verify_checksums=verify_checksums,
      unit=our_unit,
      **workdir_kwargs,
  )
  n_params = sum(int(np.prod(np.shape(a))) for a in flatten_params(params).values())
  log(f"Wrote {workdir}: {n_params:,} parameters, vocabulary {cfg.n_token}, unit {our_unit}.")
  report.update(n_token=cfg.n_token, params=n_params)
  return report


def _naming(checkpoint: str, fn, *args):
  """``fn(*args)``, with the checkpoint's path in front of a ConvertError's
  message (the state-dict checks name tensors, not files)."""
  try:
    return fn(*args)
  except ConvertError as err:
    raise ConvertError(f"checkpoint {checkpoint}: {err}") from None
