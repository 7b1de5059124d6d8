"""The run config: every key with its default, and the validation of a whole run.

Every key that a config file or a ``--config.key=value`` flag may set is
defined here, and ``get_config`` locks the dict so that a misspelt key is
an error instead of a silently ignored setting.  The ``model`` section is
derived from ``ModelConfig`` (``transformer_xl.model.config``: the one
definition of the model's hyperparameters and their checks, re-exported
here).  ``validate`` checks a whole config before anything is compiled and
raises one ``ConfigError`` that lists every problem.  NaN and infinite
floats are refused by one generic check of every float
(``nonfinite_problems``), with the exceptions in ``INFINITY_ALLOWED``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from transformer_xl import data, errors, sharding
from transformer_xl.data import babilong, config_checks, synthetic, text_settings
from transformer_xl.inference import config_checks as dynamic_checks
from transformer_xl.model import config as model_config_lib
from transformer_xl.model import memory
from transformer_xl.model.config import (  # noqa: F401 (re-exported: the model's schema)
    ATTENTION_IMPLS,
    DTYPES,
    ModelConfig,
    config_problems,
    segment_problems,
)
from transformer_xl.run import train_checks

EVAL_DOCUMENTS = ("split", "whole")  # eval.documents (inference/evaluate.py)


ConfigError = errors.ConfigError  # re-exported (transformer_xl.errors)


# Every float of the config must be finite (NaN is refused everywhere), except
# these, which may be +inf, with the meaning given:
#   train.clip: optax.clip_by_global_norm(inf) leaves every finite gradient
#     as it is (its norm is always < inf), so inf means "no clipping"; a
#     non-finite gradient norm is caught by train.nonfinite either way.
INFINITY_ALLOWED = {"train.clip": "inf = no clipping"}
# The finite range of each float, for the message that refuses a NaN or inf
# (the range itself is checked where the field is validated).
FLOAT_RANGES = {
    **model_config_lib.FLOAT_RANGES,
    "train.learning_rate": "> 0",
    "train.min_lr": ">= 0 and <= train.learning_rate",
    "train.clip": "> 0",
    "train.clip_value": ">= 0",
    "train.weight_decay": ">= 0",
    "train.adam_b1": "in [0, 1)",
    "train.adam_b2": "in [0, 1)",
    "train.adam_eps": "> 0",
    "train.aux_loss_weight": ">= 0",
    "eval.dynamic.lr": ">= 0",
    "eval.dynamic.decay": ">= 0",
    "eval.dynamic.eps": "> 0",
}


def nonfinite_problems(section: str, values: Mapping[str, Any]) -> tuple[list[str], set[str]]:
  """The NaN and infinite floats among a run config section's values
  (``model.config.nonfinite_problems`` with this schema's defaults,
  ``INFINITY_ALLOWED`` and ``FLOAT_RANGES``).

  Returns:
    (problems, names): one message per refused value, naming
    ``<section>.<key>``, the value and the fix; and the refused names.
  """
  return model_config_lib.nonfinite_problems(
      section,
      values,
      default=_default_value,
      infinity_allowed=INFINITY_ALLOWED,
      float_ranges=FLOAT_RANGES,
  )


# The synthetic tasks' defaults (the authors'), for data.synthetic_*.
_TASK = synthetic.TaskSettings(task="copy")
_BABI = babilong.BabilongSettings(task="qa1")  # ... and BABILong's, for data.babilong_*


def _default_value(name: str) -> Any:
  """The default of a dotted config key (None if there is none)."""
  node: Any = get_config()
  for part in name.split("."):
    try:
      node = node[part]
    except (KeyError, AttributeError, TypeError):
      return None
  return node


def get_config() -> ml_collections.ConfigDict:
  """Defaults: the enwik8 12-layer base model (reference ``run_enwik8_base.sh``).

  Sections: ``model`` (``ModelConfig`` without n_token),
  ``data``, ``train``, ``eval``, ``checkpoint``, ``mesh``, ``paper``.
  """
  c = ml_collections.ConfigDict()
  # e.g. --config.model.cutoffs="(20000, 40000, 200000)"; meanings: ModelConfig.
  c.model = ml_collections.ConfigDict(ModelConfig.defaults())

  c.data = ml_collections.ConfigDict(
      dict(
          dataset="enwik8",  # data.CORPUS_NAMES, "text", "tfds:NAME", "synthetic:TASK", "babilong:qaN"
          data_dir=ml_collections.FieldReference(
              None, field_type=str
          ),  # tfds data dir (default ~/tensorflow_datasets)
          manual_dir=ml_collections.FieldReference(
              None, field_type=str
          ),  # where source files already on disk are
          download=True,
          verify_checksums=True,
          # data.dataset="text": one's own files (data/text_reading.py); comma-separated globs.
          train_files="",
          valid_files="",
          test_files="",
          allow_split_overlap=False,  # True: a file may be in two splits (refused otherwise)
          tokenizer="word",  # byte | char | word | sentencepiece | pretrained:PATH
          vocab_size=0,  # word/char cap (0 = all); sentencepiece: pieces (required)
          min_count=1,  # word/char: fewer occurrences in train -> <unk>
          document_separator="file",  # file | paragraph | line: what one document is
          spm_model_type="unigram",  # unigram | bpe (tokenizer=sentencepiece)
          spm_sample_mb=32.0,  # MB of training lines SentencePiece learns from, at most
          # (a random sample; its memory is ~30x this)
          # SentencePiece's trainer (docs/guide/own_text.md): pieces of spaces only (indentation),
          spm_allow_whitespace_only_pieces=True,
          spm_split_digits=True,  # one piece per digit
          spm_byte_fallback=True,  # unseen characters as <0xNN> byte pieces, not <unk>
          spm_character_coverage=0.9995,  # share of training characters with own pieces
          spm_max_sentence_length=1 << 16,  # bytes: longer lines are not trained on
          text_key="text",  # data.dataset="tfds:NAME": the feature with the text
          tfds_splits="train,validation,test",  # ... and its splits read as train, valid, test
          documents="stream",  # stream: memory flows across documents (the reference);
          # reset: no attention across a document boundary
          # data.dataset="synthetic:copy|reverse|associative_retrieval|armt_retrieval|passkey"
          # (data/synthetic.py; defaults: Bulatov et al. 2022's generate_data.py and run scripts):
          # (values: synthetic.TaskSettings's defaults, written once there)
          synthetic_seq_len=_TASK.seq_len,  # copy/reverse: input symbols (long runs: 120)
          synthetic_num_tokens=_TASK.num_tokens,  # copy/reverse: symbols 2..num_tokens-1
          synthetic_num_pairs=_TASK.num_pairs,  # associative_retrieval: key-value pairs K
          synthetic_key_size=_TASK.key_size,  # armt_retrieval: symbols of a key (of 16)
          synthetic_value_size=_TASK.value_size,  # ... and of a value
          synthetic_train_size=_TASK.train_size,  # examples per split (their train_size,
          synthetic_valid_size=_TASK.valid_size,  # val_size, test_size), duplicates
          synthetic_test_size=_TASK.test_size,  # removed across them
          synthetic_seed=_TASK.seed,  # the numpy Generator that draws the examples
          # data.dataset="synthetic:passkey" (Mohtashami & Jaggi 2023's prompt, data/passkey.py):
          synthetic_passkey_len=_TASK.passkey_len,  # E: positions of an example
          synthetic_passkey_depth=_TASK.passkey_depth,  # filler tokens before the key; -1: drawn
          synthetic_passkey_digits=_TASK.passkey_digits,  # the key's digits (the answer)
          # data.dataset="babilong:qa1".."qa20" (Kuratov et al. 2024, data/babilong.py; the
          # authors' names and defaults; also reads data.tokenizer=pretrained:PATH and, for
          # the background text, data.text_key/tfds_splits or data.*_files):
          babilong_sample_size=_BABI.sample_size,  # E: context + question + answer tokens
          babilong_qa_margin=_BABI.qa_margin,  # of those, left for question and answer
          babilong_task_start_pct=_BABI.task_start_pct,  # where the facts go (fractions
          babilong_task_end_pct=_BABI.task_end_pct,  # of the sample); -1: anywhere
          babilong_max_n_facts=_BABI.max_n_facts,  # drop longer stories (0: none)
          babilong_min_sentence_len=_BABI.min_sentence_len,  # shorter noise sentences skipped
          babilong_train_sample_sizes=_BABI.train_sample_sizes,  # curriculum, e.g. "512,1024"
          babilong_mixed_length_ratio=_BABI.mixed_length_ratio,  # ... P(longest length)
          babilong_train_size=_BABI.train_size,  # samples (0: the train file's, less valid)
          babilong_valid_size=_BABI.valid_size,  # the train file's last samples
          babilong_test_size=_BABI.test_size,  # 0: all of the test file
          babilong_seed=_BABI.seed,  # test's sampler and noise (their 42); valid +1, train +2
          babilong_noise=_BABI.noise,  # "tfds:pg19" (theirs) or "text" (data.*_files)
      )
  )

  c.train = ml_collections.ConfigDict(
      dict(
          global_batch=22,  # rows over all devices (reference batch_size)
          batch_chunk=1,  # micro-batches per step (gradient accumulation)
          num_steps=400_000,  # reference max_step
          warmup_steps=0,
          learning_rate=2.5e-4,  # Adam, linear warmup then cosine decay to min_lr
          min_lr=0.0,  # reference eta_min
          schedule="cosine",  # after the warmup: "cosine" (the reference) | "linear" (to
          # min_lr; HuggingFace's get_linear_schedule_with_warmup, the ARMT authors')
          schedule_steps=0,  # the step where the decay reaches min_lr (0 = num_steps)
          clip=0.25,  # global gradient-norm clipping (inf = none)
          clip_value=0.0,  # clip each gradient value to [-v, v] first (torch's
          # clip_grad_value_, the ARMT authors' 1.0; 0 = none)
          weight_decay=0.0,  # decoupled weight decay of every parameter (AdamW; 0 = Adam)
          adam_b1=0.9,
          adam_b2=0.999,
          adam_eps=1e-8,
          seed=1111,  # reference default seed
          log_every=200,  # steps between logged metrics
          eval_every=4000,  # steps between validations (0 = never)
          eval_max_steps=0,  # cap on validation batches during training (0 = the whole split)
          loss_span="full",  # "full" | "half": cross-entropy on the last half of each segment
          # only (Sec. 4.2, Table 6; for absolute position encodings)
          prefetch=2,  # batches read and placed on the devices ahead, on a background
          # thread (data.Prefetcher); 0 = read in the training loop
          aux_loss_weight=1.0,  # weight of each auxiliary loss a module sows into "losses"
          # (train.aux_losses); none in the model itself
          # Backpropagation through segments (Bulatov et al. 2022), for a memory whose state
          # keeps its gradient (the memory tokens):
          mem_backprop_depth=0,  # k: each step runs the k segments before the newest one
          # again and the gradient flows back through the memory they write (0 = none)
          bptt_bp=False,  # True: the loss of every segment of the window counts (the
          # authors' --bptt_bp); False: the newest segment's only
          vary_n_segments=False,  # synthetic:armt_retrieval: each batch's pairs drawn from
          # 1..num_pairs, its last ones kept (the ARMT authors' --vary_n_segments)
          init_from="",  # a trained workdir whose parameters a new run starts from
          # (fine-tuning, e.g. adding a kNN memory: training/init_from.py)
          # Early stopping after a validation (training/early_stop.py; the authors' trainer):
          stop_metric="",  # a valid metric, e.g. "answer_accuracy" ("" = never stop early)
          stop_target=0.0,  # stop once it is this good (>= for accuracies, <= for losses)
          stop_patience=0,  # stop after this many validations without a new best (0 = off)
          # A curriculum (training/curriculum.py): stages trained one after the other, each
          # from the last one's parameters, each "KEY=VALUE ..." overrides of this config,
          # e.g. ("data.synthetic_num_pairs=1 train.num_steps=2000", "data.synthetic_num_pairs=2")
          curriculum=(),
      )
  )
  # A step whose loss, gradient norm or update is not finite is never applied (train.py):
  # "stop" ends the run there (exit status 1, checkpoints kept); "skip" goes on
  # without it and stops after max_skipped_steps such steps in a row.
  c.train.update(dict(nonfinite="stop", max_skipped_steps=10))

  c.eval = ml_collections.ConfigDict(
      dict(
          method="segments",  # "segments": tgt_len tokens a step with a memory of mem_len
          # (Transformer-XL); "sliding": every token scored by a fresh
          # pass over a window of its previous tokens (vanilla, Table 9)
          tgt_len=128,
          mem_len=512,
          clamp_len=0,
          same_length=True,  # "segments"
          window=0,  # "sliding": window length L (0 = model.tgt_len + model.mem_len)
          stride=1,  # "sliding": tokens scored per window (1 = Al-Rfou et al.)
          global_batch=10,  # reference eval_batch_size (rows, or windows per step)
          documents="split",  # "split": the split as data.documents says (one stream, or
          # documents masked apart with "reset"); "whole": every document (book) scored
          # from an empty memory to its end, results per document too (PG-19; needs a
          # corpus with documents: data.dataset "text" or "tfds:NAME")
      )
  )
  # The memory variants' evaluation overrides, eval.<variant>.<field> (unset: the model's;
  # memory.eval_override_sections).
  for name, section in memory.eval_override_sections().items():
    c.eval[name] = ml_collections.ConfigDict(section)
  # Dynamic evaluation (Krause et al. 2019; inference/dynamic_eval.py), on when lr > 0:
  # every eval segment scored, then the parameters updated by its gradient.
  c.eval.dynamic = ml_collections.ConfigDict(
      dict(
          rule="rms",  # "rms" (the authors' rule: statistics pass, then RMS-scaled steps
          # with a decay toward the loaded parameters) | "sgd" (plain SGD)
          lr=0.0,  # learning rate (0 = static evaluation)
          decay=0.001,  # "rms": pull toward the loaded parameters (authors' default)
          eps=1e-4,  # "rms": lr / (sqrt(ss) + eps) (authors' default)
          stats_tokens=-1,  # "rms": training tokens of the statistics pass
          # (-1 = 1/5000 of the training split, as the authors)
          global_batch=1,  # rows sharing one update per segment (authors: 1)
      )
  )

  c.checkpoint = ml_collections.ConfigDict(
      dict(
          every_steps=4000,
          max_to_keep=3,
      )
  )

  # Device mesh: axis names and shape; -1 takes all remaining devices.
  c.mesh = ml_collections.ConfigDict(
      dict(
          axis_names=("data", "model"),
          shape=(-1, 1),
      )
  )
  # What the paper reports for this setting, printed at start-up beside ours.
  c.paper = ml_collections.ConfigDict(
      dict(
          n_params=0,  # parameter count (0 = none reported)
          result="",  # e.g. "1.06 bpc (test)"
      )
  )
  c.lock()
  return c


# Device kinds on which Mosaic compiles the fused kernel in float32 only: before v4 the
# TPU's matrix unit takes no bfloat16 operand in a Pallas kernel (libtpu 0.0.42, compiled
# for v2 and v3: "CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on
# target: vector<128x128xbf16>").
KERNEL_FLOAT32_ONLY = ("TPU v2", "TPU v3")


# The tuple settings and the type of their elements (a value from the command line is parsed
# as a Python literal: ('a',) is a tuple too).
_TUPLE_ELEMENTS = {
    "mesh.shape": int,
    "mesh.axis_names": str,
    "model.cutoffs": int,
    "model.tie_projs": bool,
    "train.curriculum": str,
}


def tuple_elements() -> dict[str, type]:
  """{dotted key: element type} of every tuple setting: the run config's own
  and the registered memory variants' (``memory.tuple_settings``)."""
  return {**_TUPLE_ELEMENTS, **memory.tuple_settings()}


def element_type_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Tuple settings (``tuple_elements``) whose elements are of another type."""
  problems = []
  for key, kind in tuple_elements().items():
    value: Any = config
    for part in key.split("."):
      value = value.get(part) if isinstance(value, ml_collections.ConfigDict) else None
    if value is None:
      continue
    ok = lambda x: (isinstance(x, kind) and (kind is bool or not isinstance(x, bool))) or (
        isinstance(x, float) and not math.isfinite(x)  # NaN, inf: the non-finite check names
    )
    if not isinstance(value, (tuple, list)) or not all(ok(x) for x in value):
      problems.append(f"{key}={value!r}: give a tuple of {kind.__name__} values.")
  return problems


def validate(
    config: ml_collections.ConfigDict,
    num_devices: int,
    *,
    training: bool = True,
    device_kind: str | None = None,
) -> tuple[int, ...]:
  """Checks the whole config against itself and the devices.

  Everything that does not need the corpus is checked here, before data
  are loaded or anything is compiled; the vocabulary-dependent checks
  (cutoffs < n_token) follow in ``model_config``.

  Args:
    config: a config from ``get_config`` (or a configs/*.py file).
    num_devices: devices the mesh must cover (``jax.device_count()``).
    training: the config trains (``--mode=train``); False (eval, score,
      generate, ``LanguageModel``): ``train.global_batch`` and
      ``train.batch_chunk``, which they never use, are not checked against
      the mesh.
    device_kind: the devices' ``device_kind`` ("TPU v3", ...), for what
      depends on the chip (the fused kernel in bfloat16 needs TPU v4 or
      later, ``KERNEL_FLOAT32_ONLY``); None: not checked.

  Returns:
    The mesh shape, with -1 resolved.

  Raises:
    ConfigError: listing every problem (sizes that do not fit together,
      values out of range, unknown names), each with its fix.
  """
  m, t, e = config.model, config.train, config.eval
  problems = element_type_problems(config)
  if problems:  # the checks below compare the elements
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))
  mesh_shape = None
  try:
    mesh_shape = sharding.check_mesh(config.mesh.shape, config.mesh.axis_names, num_devices)
  except ValueError as err:
    problems.append(str(err))
  if mesh_shape is not None:
    sizes = dict(zip(config.mesh.axis_names, mesh_shape))
    n_data, n_model = sizes["data"] * sizes.get("fsdp", 1), sizes["model"]
    if m.n_head % n_model:
      problems.append(
          f"model.n_head={m.n_head} is not divisible by the 'model' mesh axis "
          f"({n_model}); set --config.mesh.shape so the model axis divides n_head."
      )
    if training and t.global_batch % n_data:
      problems.append(
          f"train.global_batch={t.global_batch} is not divisible by the "
          f"data-parallel mesh axes (data x fsdp = {n_data}); use a multiple of "
          f"{n_data} or change --config.mesh.shape."
      )
    elif training and (t.batch_chunk < 1 or t.global_batch % (t.batch_chunk * n_data)):
      problems.append(
          f"train.global_batch={t.global_batch} must be divisible by "
          f"train.batch_chunk * data axis = {t.batch_chunk} * {n_data}."
      )
  # NaN and inf: one check of every float (the model's in config_problems);
  # the range checks below skip the keys it refused.
  nonfinite_found, nonfinite = nonfinite_problems(
      "", {k: v for k, v in config.items() if k != "model"}
  )
  problems += config_problems(m.to_dict()) + nonfinite_found

  def finite(key: str) -> bool:
    return key not in nonfinite

  problems += segment_problems(e.tgt_len, e.mem_len, e.clamp_len, e.same_length, section="eval")
  problems += memory.eval_problems(m.to_dict(), e.to_dict())
  problems += memory.run_problems(m.to_dict(), config.to_dict())
  if e.global_batch < 1:
    problems.append(f"eval.global_batch={e.global_batch} must be >= 1.")
  if e.method not in ("segments", "sliding"):
    problems.append(f"eval.method={e.method!r}: use 'segments' or 'sliding'.")
  window = e.window or m.tgt_len + m.mem_len
  if e.window < 0 or not 1 <= e.stride <= window:
    problems.append(
        f"eval.window={e.window} must be >= 0 (0 = model.tgt_len + model.mem_len) "
        f"and eval.stride={e.stride} in [1, window={window}]."
    )
  if t.loss_span not in ("full", "half"):
    problems.append(f"train.loss_span={t.loss_span!r}: use 'full' or 'half'.")
  problems += config_checks.data_problems(config.data, nonfinite, _default_value)
  problems += config_checks.synthetic_problems(config, _default_value)
  eval_documents = e.get("documents", "split")
  if eval_documents not in EVAL_DOCUMENTS:
    problems.append(f"eval.documents={eval_documents!r}: use 'split' or 'whole'.")
  elif eval_documents == "whole" and e.method != "segments":
    problems.append(
        f"eval.documents='whole' needs eval.method='segments', not {e.method!r}: set "
        "--config.eval.method=segments."
    )
  elif eval_documents == "whole" and config.data.dataset in data.CORPUS_NAMES:
    problems.append(
        f"eval.documents='whole' needs documents, which the built-in corpus "
        f"{config.data.dataset!r} does not have: use eval.documents='split', or "
        f"data.dataset={data.TEXT!r} or 'tfds:NAME' (e.g. tfds:pg19)."
    )
  elif eval_documents == "whole" and e.get("dynamic") and e.dynamic.get("lr", 0.0) > 0:
    problems.append(
        "eval.documents='whole' does not go with dynamic evaluation (eval.dynamic.lr > 0: "
        "its parameters would carry what earlier documents taught them into the next one): "
        "leave eval.documents='split' or eval.dynamic.lr=0."
    )
  if config.data.get("documents", "stream") == "reset" and e.method == "sliding":
    problems.append(
        "data.documents='reset' is not supported by eval.method='sliding': use "
        "eval.method='segments'."
    )
  if t.num_steps < 1 or t.log_every < 1 or config.checkpoint.every_steps < 1:
    problems.append("train.num_steps, train.log_every and checkpoint.every_steps must be >= 1.")
  if config.checkpoint.max_to_keep < 1:
    problems.append(f"checkpoint.max_to_keep={config.checkpoint.max_to_keep} must be >= 1.")
  if (
      (finite("train.learning_rate") and not t.learning_rate > 0)
      or (finite("train.min_lr") and t.min_lr < 0)
      or t.warmup_steps < 0
  ):
    problems.append(
        f"train.learning_rate={t.learning_rate} must be > 0, train.min_lr="
        f"{t.min_lr} and train.warmup_steps={t.warmup_steps} >= 0."
    )
  problems += train_checks.schedule_problems(t, nonfinite)
  if finite("train.clip") and not t.clip > 0:
    problems.append(f"train.clip={t.clip} must be > 0 (the gradient-norm clip; reference 0.25).")
  for key in ("clip_value", "weight_decay"):
    if finite(f"train.{key}") and not t.get(key, 0.0) >= 0:
      problems.append(f"train.{key}={t.get(key)} must be >= 0 (0 = none).")
  if t.eval_every < 0 or t.eval_max_steps < 0:
    problems.append("train.eval_every and train.eval_max_steps must be >= 0 (0 = never / all).")
  problems += train_checks.optimizer_problems(t, nonfinite)
  problems += train_checks.stop_problems(
      t,
      synthetic.is_synthetic(config.data.dataset) or babilong.is_babilong(config.data.dataset),
      nonfinite,
  )
  problems += _curriculum_problems(config, num_devices, training, device_kind)
  problems += dynamic_checks.eval_problems(config, nonfinite, _default_value)
  problems += train_checks.bptt_problems(config)
  if (
      device_kind in KERNEL_FLOAT32_ONLY
      and m.get("attention_impl") == "pallas"
      and m.get("dtype") == "bfloat16"
  ):
    problems.append(
        f"model.attention_impl='pallas' with model.dtype='bfloat16' does not compile for "
        f"{device_kind} (Mosaic has no bfloat16 matrix products before TPU v4): use "
        "--config.model.attention_impl=xla, or --config.model.dtype=float32."
    )
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))
  return mesh_shape


def _curriculum_problems(
    config: ml_collections.ConfigDict, num_devices: int, training: bool, device_kind: str | None
) -> list[str]:
  """Every stage of ``train.curriculum`` as a config of its own (``validate``),
  its problems named by the stage."""
  stages = config.train.get("curriculum", ())
  if not stages:
    return []
  if isinstance(stages, str) or not all(isinstance(x, str) for x in stages):
    return [
        f"train.curriculum={stages!r} must be a tuple of stages, each a string of "
        'KEY=VALUE overrides, e.g. ("data.synthetic_num_pairs=1", "data.synthetic_num_pairs=2").'
    ]
  problems = []
  for i, text in enumerate(stages):
    name = f"train.curriculum[{i}] ({text!r})"
    try:
      stage = train_checks.stage_config(config, i)
    except ValueError as err:
      problems.append(f"{name}: {err}.")
      continue
    try:
      validate(stage, num_devices, training=training, device_kind=device_kind)
    except ConfigError as err:
      lines = str(err).split("\n  - ")[1:]
      problems += [f"{name}: {line}" for line in lines if not line.startswith("train.curriculum")]
  return problems


def without_legacy_keys(saved: Any) -> Any:
  """A saved config (a workdir's ``config.json``, parsed) without the model
  keys of earlier versions (``model.config.drop_legacy_keys``), the memory
  variants' flat model and eval keys moved into their sections
  (``memory.upgrade_fields``, ``memory.upgrade_eval``), so that it updates
  ``get_config()``'s locked dict, and with the SentencePiece options
  its own-text ``data`` lacks at the values of the versions before them
  (``text_settings.with_earlier_defaults``); anything but a dict is
  returned as it is.

  Raises:
    ValueError: a legacy key at a value that was never supported.
  """
  if isinstance(saved, Mapping) and isinstance(saved.get("data"), Mapping):
    saved = {**saved, "data": text_settings.with_earlier_defaults(saved["data"])}
  if not isinstance(saved, Mapping) or not isinstance(saved.get("model"), Mapping):
    return saved
  out = {
      **saved,
      "model": memory.upgrade_fields(model_config_lib.drop_legacy_keys(saved["model"], "model")),
  }
  if isinstance(saved.get("eval"), Mapping):
    out["eval"] = memory.upgrade_eval(saved["eval"])
  return out


def model_config(config: ml_collections.ConfigDict, n_token: int) -> ModelConfig:
  """The training ``ModelConfig`` of ``config.model`` for a vocabulary.

  Raises:
    ConfigError: the model settings do not fit this vocabulary (e.g.
      cutoffs >= n_token), or are invalid.
  """
  try:
    return ModelConfig.from_dict({"n_token": n_token, **config.model.to_dict()})
  except ValueError as err:
    raise ConfigError(f"Invalid config for a vocabulary of {n_token:,}: {err}") from None


def set_model_config(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> None:
  """Writes every field of ``model_cfg`` but n_token into ``config.model``
  (the inverse of ``model_config``; used by the converter)."""
  fields = model_cfg.to_dict()
  fields.pop("n_token")
  fields["d_embed"] = int(fields["d_embed"] or 0)
  config.model.update(
      {
          k: tuple(v) if isinstance(v, Sequence) and not isinstance(v, str) else v
          for k, v in fields.items()
      }
  )
