"""A trained model as evaluation, scoring and generation use it.

The one rule of every mode that uses a trained model (``--mode=eval``,
``score``, ``generate`` and ``LanguageModel``): the architecture is the
trained one (a workdir's ``model_config.json``) and only the free settings
(how it is computed: ``FREE_KEYS``) come from the config
(``apply_free_settings``, ``model_configs``).  The corpus that encodes and
decodes its text is checked against it (``load_corpus``,
``check_vocabulary``), and a prompt is encoded as the model reads it
(``encode_prompt``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np
from etils import epath

from transformer_xl import data, default_config
from transformer_xl.data import text_vocab
from transformer_xl.model import config as model_config_lib
from transformer_xl.model import models, tuning
from transformer_xl.run import distributed
from transformer_xl.run import workdir as wd

# The model settings that evaluation, scoring and generation take from the config, not
# from the trained model: how the model is computed (``tuning.FREE_MODEL_KEYS``: the same
# parameters and results) and the compute dtype (the parameters are float32 whatever it
# is; the results differ by its rounding).  ``apply_free_settings``.
FREE_KEYS = (*tuning.FREE_MODEL_KEYS, "dtype")
# Model settings that only training uses (evaluation has no dropout; the initialisers do
# not matter to trained parameters): neither applied nor compared.
TRAINING_ONLY_KEYS = ("dropout", "dropatt", "init_std", "proj_init_std")
# The training segment settings, and the eval settings that evaluation, scoring and
# generation use instead (named in the message that refuses a change of the former).
_EVAL_INSTEAD = {k: f"eval.{k}" for k in ("tgt_len", "mem_len", "clamp_len", "same_length")}


def _comparable(key: str, value: Any, fields: Mapping[str, Any]) -> Any:
  """A model setting in one spelling: tuples for sequences, d_embed 0 for "no projection"
  (None, 0 and d_model mean the same: ``models.ModelConfig.embed_dim``)."""
  if key == "d_embed" and value in (None, 0, fields.get("d_model")):
    return 0
  if isinstance(value, (list, tuple)):
    return tuple(value)
  return value


def apply_free_settings(
    trained: models.ModelConfig,
    settings: Mapping[str, Any],
    *,
    source: str = "the config",
    where: str = "",
) -> models.ModelConfig:
  """The trained model with the free settings of ``settings`` (``FREE_KEYS``).

  The one rule of every mode that uses a trained model (``--mode=eval``,
  ``score``, ``generate`` and ``LanguageModel``): the architecture is the
  trained one (a workdir's ``model_config.json``); the free settings, how
  it is computed (``dtype``, ``attention_impl``, ``remat``, ``attn_block``,
  ``scan_unroll``), are those of ``settings``; the training-only settings
  (``TRAINING_ONLY_KEYS``) are ignored; every other setting must equal the
  trained value.

  Args:
    trained: the trained model (with its n_token).
    settings: model settings by name, e.g. ``config.model`` (a ConfigDict
      or a dict of some of them; the memory variants' as their sections,
      ``model.<variant>``, compared field by field); a key it lacks keeps
      the trained value, a key that is no ModelConfig field is not read.
    source: what ``settings`` came from, for the message (e.g. "--config").
    where: the trained model's file, for the message.

  Returns:
    ``trained`` with the free settings of ``settings``.

  Raises:
    default_config.ConfigError: a setting of the architecture (or of the
      training segments) differs from the trained value (one line naming
      each such key with both values), or a free setting the trained model
      cannot take (e.g. attention_impl="pallas" with attn_type 2).
  """
  fields = model_config_lib.flat_fields(trained.to_dict())
  settings = model_config_lib.flat_fields(
      settings.to_dict() if isinstance(settings, ml_collections.ConfigDict) else settings
  )
  wanted = {k: settings[k] if k in settings else v for k, v in fields.items()}
  free, changed = {}, []
  for key in fields:
    if key == "n_token" or key not in settings or key in TRAINING_ONLY_KEYS:
      continue
    if key in FREE_KEYS:
      free[key] = wanted[key]
    elif _comparable(key, wanted[key], wanted) != _comparable(key, fields[key], fields):
      instead = f"; evaluation uses {_EVAL_INSTEAD[key]}" if key in _EVAL_INSTEAD else ""
      changed.append(f"model.{key}={wanted[key]!r} (trained: {fields[key]!r}{instead})")
  if changed:
    names = ["dtype", *tuning.FREE_MODEL_KEYS]
    raise default_config.ConfigError(
        f"{source} sets {', '.join(changed)}, which the trained model"
        f"{f' ({where})' if where else ''} cannot take: its architecture and training "
        f"segments are fixed, only model.{', '.join(names[:-1])} and {names[-1]} may differ; "
        "give the trained values or leave them out."
    )
  try:
    return dataclasses.replace(trained, **free)
  except ValueError as err:
    raise default_config.ConfigError(f"{source}: {err}") from None


def model_configs(
    config: ml_collections.ConfigDict, workdir: str, source: str = "the config"
) -> tuple[models.ModelConfig, models.ModelConfig, str]:
  """A workdir's model as trained, and as used with ``config``.

  Args:
    config: the config (its ``model`` section: ``apply_free_settings``).
    workdir: a training (or converted) run's directory.
    source: what ``config`` came from, for the message.

  Returns:
    (trained, used, unit): ``<workdir>/model_config.json``'s model (what
    the checkpoints are restored with), the same with the config's free
    settings (what computes), and the corpus's unit.

  Raises:
    FileNotFoundError: no model_config.json.
    WorkdirError: model_config.json is damaged.
    default_config.ConfigError: ``config`` changes the architecture.
  """
  trained, unit = wd.load_model_config(workdir)
  path = str(epath.Path(workdir) / "model_config.json")
  return trained, apply_free_settings(trained, config.model, source=source, where=path), unit


def load_corpus(
    config: ml_collections.ConfigDict, model_cfg: models.ModelConfig, workdir: str | None = None
) -> data.Corpus:
  """The corpus that generation and scoring encode and decode text with, checked
  against the model.

  For one's own text (``data.dataset="text"`` or ``"tfds:..."``), the
  tokenizer saved in ``workdir`` (``text_vocab.TOKENIZER_FILE``, written by
  training) when it has one: a vocabulary-only corpus that tokenises
  exactly as the run was trained, whatever became of the corpus files
  since; no file of the corpus is read and nothing is prepared.
  Otherwise (a built-in corpus, a workdir without a saved tokenizer) the
  corpus of ``config.data``, prepared first if needed.

  Raises:
    data.DataError: the corpus cannot be loaded, tokenises differently from
      the run in ``workdir`` (``text_vocab.check_saved_tokenizer``), or its
      vocabulary size is not the model's n_token.
  """
  data_cfg = config.data.to_dict()
  corpus = None
  if workdir is not None and data_cfg["dataset"] not in data.CORPUS_NAMES:
    corpus = text_vocab.load_saved_tokenizer(workdir)
    if corpus is not None and corpus.vocab_size != model_cfg.n_token:
      path = epath.Path(workdir) / text_vocab.TOKENIZER_FILE
      raise data.DataError(
          f"{path} is damaged (its vocab has {corpus.vocab_size:,} symbols, the model "
          f"{model_cfg.n_token:,}): restore it from a copy, or delete it (resuming the "
          "training with its text files writes it again)."
      )
  if corpus is None:
    corpus = distributed.process_0_first(lambda: data.load_configured(data_cfg), (data.DataError,))
    if workdir is not None and corpus.name == data.TEXT:
      text_vocab.check_saved_tokenizer(corpus, workdir)
  check_vocabulary(corpus, model_cfg)
  return corpus


def require_tokenizer(corpus: data.Corpus, flag: str, instead: str) -> None:
  """Checks that ``corpus`` can encode the text a flag gives (a synthetic
  task's corpus has only token ids).

  Args:
    corpus: the loaded corpus.
    flag: the flag that gives text, e.g. "--text".
    instead: what to give instead, e.g. "--tokens=FILE.npy (...)".

  Raises:
    data.DataError: the corpus has no tokenizer.
  """
  if corpus.tokenizer is None:
    raise data.DataError(
        f"{flag} gives text, but corpus {corpus.name} has no tokenizer (its examples are "
        f"token ids, no text): use {instead}."
    )


def check_vocabulary(corpus: data.Corpus, model_cfg: models.ModelConfig) -> None:
  """Checks that ``corpus`` has the model's n_token symbols.

  Raises:
    data.DataError: it has another number.
  """
  if corpus.vocab_size != model_cfg.n_token:
    raise data.DataError(
        f"the model has {model_cfg.n_token:,} tokens but corpus {corpus.name} "
        f"has {corpus.vocab_size:,}: is data.dataset right?"
    )


def encode_prompt(corpus: data.Corpus, prompt: str) -> np.ndarray:
  """int32 [N + 1]: the boundary symbol, then the prompt's ids.

  The model reads the boundary symbol first, as ``--mode=score --text``
  does, so the prompt's first token has a context.  A last line without a
  line break stays open (no end symbol after it), so generation continues
  it; a prompt ending in a newline ends its line and generation starts a
  new one.

  Raises:
    default_config.ConfigError: an empty prompt, or one whose every token
      is the unknown-word symbol.
    data.DataError: a character the corpus does not have (text8, ptb_char).
  """
  ids = corpus.encode(prompt, end_last_line=False)
  if not ids.size:
    raise default_config.ConfigError(
        f"the prompt {prompt!r} is empty: it has no {corpus.unit} of the {corpus.name} "
        "vocabulary (give text with --prompt=TEXT or --prompt_file=FILE)."
    )
  if corpus.unk_id is not None and np.all(ids == corpus.unk_id):
    raise default_config.ConfigError(
        f"the prompt {prompt!r} has no known token: every {corpus.unit} would be "
        f"{corpus.vocab[corpus.unk_id]} in the {corpus.name} vocabulary of "
        f"{corpus.vocab_size:,}."
    )
  return np.concatenate([[corpus.boundary_id], ids]).astype(np.int32)
