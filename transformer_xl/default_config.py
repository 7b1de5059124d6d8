"""The configuration schema with defaults, and its validation in one place.

Every key that a config file or a ``--config.key=value`` flag may set is
defined here, and :func:`get_config` locks the dict so that a misspelt key is
an error instead of a silently ignored setting.  The ``model`` section is
derived from :class:`ModelConfig` (the one definition of the model's
hyperparameters, with the reference implementation's names; ``models.py``
builds the model from it).  :func:`validate` checks a whole config before
anything is compiled and raises one :class:`ConfigError` that lists every
problem; :func:`config_problems` and :func:`segment_problems` are its checks
of the model's fields, which a :class:`ModelConfig` also runs when it is
constructed.  NaN and infinite floats are refused by one generic check of
every float (:func:`nonfinite_problems`), with the exceptions in
:data:`INFINITY_ALLOWED`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_xl import adaptive, attention, data, sharding, tuning
from transformer_xl.data import text_settings

DTYPES = ("float32", "bfloat16")  # model.dtype
ATTENTION_IMPLS = ("xla", "pallas")  # model.attention_impl
NONFINITE_POLICIES = ("stop", "skip")  # train.nonfinite


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


# Every float of the config must be finite (NaN is refused everywhere), except
# these, which may be +inf, with the meaning given:
#   train.clip: optax.clip_by_global_norm(inf) leaves every finite gradient
#     as it is (its norm is always < inf), so inf means "no clipping"; a
#     non-finite gradient norm is caught by train.nonfinite either way.
INFINITY_ALLOWED = {"train.clip": "inf = no clipping"}
# The finite range of each float, for the message that refuses a NaN or inf
# (the range itself is checked where the field is validated).
FLOAT_RANGES = {
    "model.dropout": "in [0, 1)", "model.dropatt": "in [0, 1)",
    "model.init_std": "> 0", "model.proj_init_std": "> 0",
    "train.learning_rate": "> 0", "train.min_lr": ">= 0 and <= train.learning_rate",
    "train.clip": "> 0", "train.adam_b1": "in [0, 1)", "train.adam_b2": "in [0, 1)",
    "train.adam_eps": "> 0",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model's hyperparameters: the one definition of their names and defaults.

  ``default_config.get_config().model`` is derived from these fields (all
  but ``n_token``, which comes from the corpus); the names and meanings are
  the reference implementation's (``train.py`` arguments).  The defaults
  are the enwik8 12-layer base model.

  Attributes:
    n_token: vocabulary size.
    n_layer, d_model, n_head, d_head, d_inner: sizes (Dai et al. 2019, Sec. 4).
    dropout: rate at the embeddings, attention output, both feed-forward
      sites and the final hidden state.
    dropatt: rate on the attention probabilities.
    tgt_len: T, tokens predicted per segment.
    mem_len: M, cached positions per layer.
    ext_len: positions at the end of a segment that are not cached
      (reference ``ext_len``; 0 in every reference script).
    clamp_len: largest relative distance encoded (0 = no clamp).
    same_length: every query attends to at most mem_len keys.
    pre_lnorm: LayerNorm before each sub-block (default: after, as in the
      paper).
    untie_r: per-layer u, v (``r_w_bias``, ``r_r_bias``) instead of shared.
    tie_weight: output softmax weights shared with the input embedding
      (all cluster tables with the adaptive softmax).
    attn_type: attention variant, the reference's numbering
      (``attention.ATTENTION_TYPES``): 0 = Transformer-XL (Sec. 3.3), 1 =
      Shaw et al. (2018) learned relative, 2 = Vaswani et al. (2017)
      absolute sinusoid, 3 = Al-Rfou et al. (2018) learned absolute per
      layer (needs n_head * d_head == d_model).
    max_klen: rows of the learned position tables of types 1 and 3; 0 =
      the training attention length tgt_len + ext_len + mem_len (the
      reference's ``max_klen``).  The eval config keeps the training value.
    attn_block: queries per block of the blockwise attention (0 = the full
      [B, H, T, K] computation at once); the result is the same, the
      temporaries O(attn_block x K) (attention_ops.attend).  -1 (the default)
      = chosen per backend and use by ``tuning.attn_block_size``.
    attention_impl: how attn_type 0's attention is computed: "xla" (scores
      and probabilities as [B, H, T, K] tensors, blockwise per
      ``attn_block``) or "pallas" (the fused kernel of
      ``pallas_attention``: no [B, H, T, K] tensor; Mosaic on TPU, Triton
      on GPU, interpret mode elsewhere (exact, slow)).  The same results;
      a free setting (a workdir trained with one evaluates with the
      other).  Training steps with dropatt > 0 use "xla" (logged once).
    scan_unroll: layers per iteration of the ``nn.scan`` loop over layers
      (1 = one layer per iteration; n_layer or more = fully unrolled); the
      parameters and results are the same.  -1 (the default) = chosen per
      backend by ``tuning.scan_unroll_layers``.
    init_std: std of weight, embedding and u/v initialisation (0.02).
    dtype: compute dtype name, one of :data:`DTYPES`; parameters are
      float32; softmax and loss are float32.
    remat: rematerialisation policy of each layer in the backward pass, a
      key of ``tuning.REMAT_POLICIES``: "none", "full" (recompute the layer),
      "dots" (keep every matmul output), "save_qkv_proj" (keep the q, k, v
      and W_kR R projections), "save_proj" (keep every projection; the
      [B, H, T, K] scores are recomputed).
    d_embed: embedding size of the first cluster; 0 (or None) = d_model.
      With d_embed != d_model the embedding and softmax are projected
      (reference ``d_embed``).
    div_val: cluster i embeds in ``d_embed // div_val**i`` dimensions
      (Baevski & Auli 2018; reference ``div_val``; 1 = one table).
    cutoffs: adaptive input/softmax cluster boundaries, strictly increasing
      and < n_token; () = a plain dense softmax (reference ``cutoffs``).
    tie_projs: () (nothing tied) or one bool per cluster (len(cutoffs) + 1):
      the softmax uses the embedding's projection for that cluster
      (reference ``tie_projs``; wt103 uses (False, True, True, True)).  A
      no-op where there is no projection (div_val == 1, d_embed == d_model).
    proj_init_std: std of the embedding/softmax projection init (0.01).

  Raises:
    ValueError (on construction): every problem :func:`config_problems`
      finds, in one message.
  """

  n_token: int
  n_layer: int = 12
  d_model: int = 512
  n_head: int = 8
  d_head: int = 64
  d_inner: int = 2048
  dropout: float = 0.1
  dropatt: float = 0.0
  tgt_len: int = 512
  mem_len: int = 512
  ext_len: int = 0
  clamp_len: int = 0
  same_length: bool = False
  pre_lnorm: bool = False
  untie_r: bool = False
  tie_weight: bool = True
  attn_type: int = 0
  max_klen: int = 0
  attn_block: int = -1
  attention_impl: str = "xla"
  scan_unroll: int = -1
  init_std: float = 0.02
  dtype: str = "float32"
  remat: str = "none"
  d_embed: Optional[int] = 0
  div_val: int = 1
  cutoffs: tuple = ()
  tie_projs: tuple = ()
  proj_init_std: float = 0.01

  def __post_init__(self):
    object.__setattr__(self, "cutoffs", tuple(int(c) for c in (self.cutoffs or ())))
    object.__setattr__(self, "tie_projs", tuple(bool(t) for t in (self.tie_projs or ())))
    problems = config_problems(dataclasses.asdict(self))
    if problems:
      raise ValueError("Invalid model config: " + " ".join(problems))

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """{field: default} for every field but n_token (``default_config.model``)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "n_token"}

  @property
  def pos_table_len(self) -> int:
    """``max_klen`` resolved: tgt_len + ext_len + mem_len when it is 0."""
    return self.max_klen or self.tgt_len + self.ext_len + self.mem_len

  @property
  def embed_dim(self) -> int:
    """``d_embed`` resolved: d_model when d_embed is 0 or None."""
    return self.d_model if not self.d_embed else int(self.d_embed)

  @property
  def compute_dtype(self):
    """``dtype`` as a numpy dtype."""
    return jnp.dtype(self.dtype)


def segment_problems(tgt_len: int, mem_len: int, clamp_len: int, same_length: bool,
                     ext_len: int = 0, section: str = "model") -> list[str]:
  """Problems of a segment layout (training ``model.*`` or ``eval.*``).

  Returns:
    One message per problem, naming ``<section>.<key>`` and the fix; [] if
    none.
  """
  problems = []
  if tgt_len < 1 or mem_len < 0 or clamp_len < 0:
    problems.append(f"{section}: tgt_len must be >= 1 and mem_len, clamp_len >= 0 (got "
                    f"{tgt_len}, {mem_len}, {clamp_len}).")
  if same_length and mem_len < 1:
    problems.append(f"{section}.same_length=True needs {section}.mem_len >= 1 (with no memory "
                    "every key would be masked).")
  if not 0 <= ext_len < max(tgt_len, 1):
    problems.append(f"{section}.ext_len={ext_len} must be in [0, tgt_len={tgt_len}).")
  return problems


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Every problem of a set of model hyperparameters, before anything is built.

  Args:
    fields: ModelConfig fields by name (e.g. ``config.model.to_dict()``);
      without ``n_token`` (the vocabulary is not known before the corpus is
      loaded) the checks that need it are skipped.

  Returns:
    One message per problem, naming ``model.<key>`` and the fix; [] if none.
  """
  f = {**ModelConfig.defaults(), **fields}
  problems, nonfinite = nonfinite_problems("model", f)
  for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner"):
    if f[key] < 1:
      problems.append(f"model.{key}={f[key]} must be >= 1.")
  if f["d_model"] % 2:
    problems.append(f"model.d_model={f['d_model']} must be even (sinusoid encoding).")
  problems += segment_problems(f["tgt_len"], f["mem_len"], f["clamp_len"], f["same_length"],
                               f["ext_len"])
  for key in ("dropout", "dropatt"):
    if f"model.{key}" not in nonfinite and not 0.0 <= f[key] < 1.0:
      problems.append(f"model.{key}={f[key]} must be in [0, 1).")
  for key in ("init_std", "proj_init_std"):
    if f"model.{key}" not in nonfinite and not 0.0 < f[key]:
      problems.append(f"model.{key}={f[key]} must be > 0 (the std of a normal initialiser).")
  if f["dtype"] not in DTYPES:
    problems.append(f"model.dtype={f['dtype']!r}: use one of {DTYPES}.")
  if f["remat"] not in tuning.REMAT_POLICIES:
    problems.append(f"model.remat={f['remat']!r}: use one of {tuple(tuning.REMAT_POLICIES)}.")
  problems += attention.config_problems(f)
  if f["attn_block"] < -1:
    problems.append(f"model.attn_block={f['attn_block']} must be >= -1 (-1 = chosen per "
                    "backend, 0 = no blocks, N = queries per block).")
  if f["attention_impl"] not in ATTENTION_IMPLS:
    problems.append(f"model.attention_impl={f['attention_impl']!r}: use one of "
                    f"{ATTENTION_IMPLS}.")
  elif f["attention_impl"] == "pallas" and f["attn_type"] != 0:
    problems.append(f"model.attention_impl='pallas' is the kernel of attn_type 0 "
                    f"(Transformer-XL); model.attn_type={f['attn_type']} needs "
                    "model.attention_impl='xla'.")
  if f["scan_unroll"] < -1 or f["scan_unroll"] == 0:
    problems.append(f"model.scan_unroll={f['scan_unroll']} must be -1 (chosen per backend) or "
                    ">= 1 (layers per iteration of the loop over layers).")
  if f["max_klen"] < 0:
    problems.append(f"model.max_klen={f['max_klen']} must be >= 0 (0 = tgt_len + ext_len + "
                    "mem_len).")
  embed_dim = f["d_model"] if not f["d_embed"] else int(f["d_embed"])
  problems += adaptive.config_problems(f.get("n_token"), embed_dim, f["d_model"],
                                       tuple(f["cutoffs"] or ()), f["div_val"],
                                       tuple(f["tie_projs"] or ()))
  return problems


def nonfinite_problems(section: str, values: Mapping[str, Any]) -> tuple[list[str], set[str]]:
  """The NaN and infinite floats among a config section's values.

  One generic check of every float (and every float inside a tuple or list;
  nested sections are walked): NaN is refused everywhere, +-inf everywhere
  but in :data:`INFINITY_ALLOWED`.  The range checks of :func:`validate`
  and :func:`config_problems` skip the keys refused here, so that each bad
  value is named once.

  Args:
    section: the section's dotted name, e.g. "train" (prefix of the keys;
      "" for a whole config).
    values: key -> value (a ConfigDict section or a dict of ModelConfig fields).

  Returns:
    (problems, names): one message per refused value, naming
    ``<section>.<key>``, the value and the fix; and the refused
    ``<section>.<key>`` names.
  """
  problems, names = [], set()
  for key, value in values.items():
    name = f"{section}.{key}" if section else str(key)
    if isinstance(value, (ml_collections.ConfigDict, Mapping)):
      sub_problems, sub_names = nonfinite_problems(name, value)
      problems += sub_problems
      names |= sub_names
      continue
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    bad = [float(v) for v in items if isinstance(v, (float, np.floating))
           and not math.isfinite(v) and not (v == math.inf and name in INFINITY_ALLOWED)]
    if not bad:
      continue
    if isinstance(value, (tuple, list)):
      what = f"holds {bad[0]}"
    else:
      what = "is not a number" if math.isnan(bad[0]) else "is infinite"
    allowed, default = INFINITY_ALLOWED.get(name), _default_value(name)
    notes = [n for n in (allowed, f"e.g. {default!r}" if isinstance(default, float) else "") if n]
    fix = ("give finite values" if isinstance(value, (tuple, list)) else
           f"give a {'' if allowed else 'finite '}value"
           + (f" {FLOAT_RANGES[name]}" if name in FLOAT_RANGES else "")
           + (f" ({'; '.join(notes)})" if notes else ""))
    problems.append(f"{name}={value} {what}: {fix}.")
    names.add(name)
  return problems, names


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

  Sections: ``model`` (:class:`ModelConfig` without n_token),
  ``data``, ``train``, ``eval``, ``checkpoint``, ``mesh``, ``paper``.
  """
  c = ml_collections.ConfigDict()
  # e.g. --config.model.cutoffs="(20000, 40000, 200000)"; meanings: ModelConfig.
  c.model = ml_collections.ConfigDict(ModelConfig.defaults())

  c.data = ml_collections.ConfigDict(dict(
      dataset="enwik8",  # one of data.CORPUS_NAMES, "text" (own files) or "tfds:NAME"
      data_dir=ml_collections.FieldReference(None, field_type=str),    # tfds data dir (default ~/tensorflow_datasets)
      manual_dir=ml_collections.FieldReference(None, field_type=str),  # where source files already on disk are
      download=True,
      verify_checksums=True,
      # data.dataset="text": one's own files (data/text_files.py); comma-separated globs.
      train_files="", valid_files="", test_files="",
      tokenizer="word",          # byte | char | word | sentencepiece | pretrained:PATH
      vocab_size=0,              # word/char cap (0 = all); sentencepiece: pieces (required)
      min_count=1,               # word/char: fewer occurrences in train -> <unk>
      document_separator="file", # file | paragraph | line: what one document is
      spm_model_type="unigram",  # unigram | bpe (tokenizer=sentencepiece)
      spm_sample_mb=32.0,        # MB of training lines SentencePiece learns from, at most
                                 # (a random sample; its memory is ~30x this)
      text_key="text",           # data.dataset="tfds:NAME": the feature with the text
      tfds_splits="train,validation,test",  # ... and its splits read as train, valid, test
      documents="stream",        # stream: memory flows across documents (the reference);
                                 # reset: no attention across a document boundary
  ))

  c.train = ml_collections.ConfigDict(dict(
      global_batch=22,       # rows over all devices (reference batch_size)
      batch_chunk=1,         # micro-batches per step (gradient accumulation)
      num_steps=400_000,     # reference max_step
      warmup_steps=0,
      learning_rate=2.5e-4,  # Adam, linear warmup then cosine decay to min_lr
      min_lr=0.0,            # reference eta_min
      clip=0.25,             # global gradient-norm clipping
      adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
      seed=1111,             # reference default seed
      log_every=200,         # steps between logged metrics
      eval_every=4000,       # steps between validations (0 = never)
      eval_max_steps=0,      # cap on validation batches during training (0 = the whole split)
      loss_span="full",      # "full" | "half": cross-entropy on the last half of each segment
                             # only (Sec. 4.2, Table 6; for absolute position encodings)
      prefetch=2,            # batches read and placed on the devices ahead, on a background
                             # thread (data.Prefetcher); 0 = read in the training loop
  ))
  # A step whose loss, gradient norm or update is not finite is never applied (train.py):
  # "stop" ends the run there (exit status 1, checkpoints kept); "skip" goes on
  # without it and stops after max_skipped_steps such steps in a row.
  c.train.update(dict(nonfinite="stop", max_skipped_steps=10))

  c.eval = ml_collections.ConfigDict(dict(
      method="segments",     # "segments": tgt_len tokens a step with a memory of mem_len
                             # (Transformer-XL); "sliding": every token scored by a fresh
                             # pass over a window of its previous tokens (vanilla, Table 9)
      tgt_len=128, mem_len=512, clamp_len=0, same_length=True,  # "segments"
      window=0,              # "sliding": window length L (0 = model.tgt_len + model.mem_len)
      stride=1,              # "sliding": tokens scored per window (1 = Al-Rfou et al.)
      global_batch=10,       # reference eval_batch_size (rows, or windows per step)
  ))

  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=4000,
      max_to_keep=3,
  ))

  # Device mesh: axis names and shape; -1 takes all remaining devices.
  c.mesh = ml_collections.ConfigDict(dict(
      axis_names=("data", "model"),
      shape=(-1, 1),
  ))
  # What the paper reports for this setting, printed at start-up beside ours.
  c.paper = ml_collections.ConfigDict(dict(
      n_params=0,   # parameter count (0 = none reported)
      result="",    # e.g. "1.06 bpc (test)"
  ))
  c.lock()
  return c


def validate(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
  """Checks the whole config against itself and the devices.

  Everything that does not need the corpus is checked here, before data
  are loaded or anything is compiled; the vocabulary-dependent checks
  (cutoffs < n_token) follow in :func:`model_config`.

  Args:
    config: a config from :func:`get_config` (or a configs/*.py file).
    num_devices: devices the mesh must cover (``jax.device_count()``).

  Returns:
    The mesh shape, with -1 resolved.

  Raises:
    ConfigError: listing every problem (sizes that do not fit together,
      values out of range, unknown names), each with its fix.
  """
  m, t, e = config.model, config.train, config.eval
  problems, mesh_shape = [], None
  try:
    mesh_shape = sharding.check_mesh(config.mesh.shape, config.mesh.axis_names, num_devices)
  except ValueError as err:
    problems.append(str(err))
  if mesh_shape is not None:
    sizes = dict(zip(config.mesh.axis_names, mesh_shape))
    n_data, n_model = sizes["data"] * sizes.get("fsdp", 1), sizes["model"]
    if m.n_head % n_model:
      problems.append(f"model.n_head={m.n_head} is not divisible by the 'model' mesh axis "
                      f"({n_model}); set --config.mesh.shape so the model axis divides n_head.")
    if t.global_batch % n_data:
      problems.append(f"train.global_batch={t.global_batch} is not divisible by the "
                      f"data-parallel mesh axes (data x fsdp = {n_data}); use a multiple of "
                      f"{n_data} or change --config.mesh.shape.")
    elif t.batch_chunk < 1 or t.global_batch % (t.batch_chunk * n_data):
      problems.append(f"train.global_batch={t.global_batch} must be divisible by "
                      f"train.batch_chunk * data axis = {t.batch_chunk} * {n_data}.")
  # NaN and inf: one check of every float (the model's in config_problems);
  # the range checks below skip the keys it refused.
  nonfinite_found, nonfinite = nonfinite_problems(
      "", {k: v for k, v in config.items() if k != "model"})
  problems += config_problems(m.to_dict()) + nonfinite_found

  def finite(key: str) -> bool:
    return key not in nonfinite

  if m.ext_len:
    problems.append(f"model.ext_len={m.ext_len}: extended context is not supported by the "
                    "input pipeline; set --config.model.ext_len=0 (all reference scripts do).")
  problems += segment_problems(e.tgt_len, e.mem_len, e.clamp_len, e.same_length,
                                      section="eval")
  if e.global_batch < 1:
    problems.append(f"eval.global_batch={e.global_batch} must be >= 1.")
  if e.method not in ("segments", "sliding"):
    problems.append(f"eval.method={e.method!r}: use 'segments' or 'sliding'.")
  window = e.window or m.tgt_len + m.mem_len
  if e.window < 0 or not 1 <= e.stride <= window:
    problems.append(f"eval.window={e.window} must be >= 0 (0 = model.tgt_len + model.mem_len) "
                    f"and eval.stride={e.stride} in [1, window={window}].")
  if t.loss_span not in ("full", "half"):
    problems.append(f"train.loss_span={t.loss_span!r}: use 'full' or 'half'.")
  problems += _data_problems(config.data, nonfinite)
  if config.data.get("documents", "stream") == "reset" and e.method == "sliding":
    problems.append("data.documents='reset' is not supported by eval.method='sliding': use "
                    "eval.method='segments'.")
  if t.num_steps < 1 or t.log_every < 1 or config.checkpoint.every_steps < 1:
    problems.append("train.num_steps, train.log_every and checkpoint.every_steps must be >= 1.")
  if config.checkpoint.max_to_keep < 1:
    problems.append(f"checkpoint.max_to_keep={config.checkpoint.max_to_keep} must be >= 1.")
  if ((finite("train.learning_rate") and not t.learning_rate > 0)
      or (finite("train.min_lr") and t.min_lr < 0) or t.warmup_steps < 0):
    problems.append(f"train.learning_rate={t.learning_rate} must be > 0, train.min_lr="
                    f"{t.min_lr} and train.warmup_steps={t.warmup_steps} >= 0.")
  problems += _schedule_problems(t, nonfinite)
  if finite("train.clip") and not t.clip > 0:
    problems.append(f"train.clip={t.clip} must be > 0 (the gradient-norm clip; reference 0.25).")
  if t.eval_every < 0 or t.eval_max_steps < 0:
    problems.append("train.eval_every and train.eval_max_steps must be >= 0 (0 = never / all).")
  problems += _optimizer_problems(t, nonfinite)
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))
  return mesh_shape


def _data_problems(d: ml_collections.ConfigDict, nonfinite: set[str]) -> list[str]:
  """The dataset name, and the text-file fields: set only for data.dataset="text".

  A field in ``nonfinite`` (already refused) counts as its default here."""
  text = {k: (d.get(k, _default_value(f"data.{k}")) if f"data.{k}" not in nonfinite
              else _default_value(f"data.{k}")) for k in data.TEXT_FIELDS}
  documents = d.get("documents", "stream")
  if documents not in ("stream", "reset"):
    return [f"data.documents={documents!r}: use 'stream' (memory flows across documents) or "
            "'reset' (no attention across a document boundary)."]
  if d.dataset == data.TEXT or d.dataset.startswith(data.TFDS_PREFIX):
    tfds_name = d.dataset[len(data.TFDS_PREFIX):] if d.dataset != data.TEXT else ""
    if d.dataset != data.TEXT and not tfds_name:
      return [f"data.dataset={d.dataset!r}: name the tfds dataset, e.g. 'tfds:pg19'."]
    return text_settings.settings_problems(
        text_settings.TextSettings(**text, tfds_name=tfds_name))
  if documents == "reset":
    return [f"data.documents='reset' needs documents, which the built-in corpus "
            f"{d.dataset!r} does not have: use 'stream', or data.dataset={data.TEXT!r}."]
  if d.dataset not in data.CORPUS_NAMES:
    return [f"data.dataset={d.dataset!r}: choose one of {sorted(data.CORPUS_NAMES)}, "
            f"{data.TEXT!r} for your own text files (data.train_files, ...), or "
            "'tfds:NAME' for a tfds text dataset."]
  changed = [k for k, v in text.items() if v != _default_value(f"data.{k}")]
  if changed:
    verb = "applies" if len(changed) == 1 else "apply"
    return [f"data.{', data.'.join(changed)} {verb} only to data.dataset={data.TEXT!r} (your "
            f"own text files), not to the built-in corpus {d.dataset!r}: remove them, or set "
            f"--config.data.dataset={data.TEXT}."]
  return []


def _schedule_problems(t: ml_collections.ConfigDict, nonfinite: set[str]) -> list[str]:
  """The learning-rate schedule's ranges beyond the signs checked in :func:`validate`
  (``nonfinite``: the keys :func:`nonfinite_problems` refused, not checked again)."""
  problems = []
  if ({"train.learning_rate", "train.min_lr"}.isdisjoint(nonfinite)
      and 0 <= t.min_lr and 0 < t.learning_rate < t.min_lr):
    problems.append(f"train.min_lr={t.min_lr} must be <= train.learning_rate="
                    f"{t.learning_rate} (the cosine decays from learning_rate to min_lr).")
  if t.num_steps >= 1 and t.warmup_steps > t.num_steps:
    problems.append(f"train.warmup_steps={t.warmup_steps} must be <= train.num_steps="
                    f"{t.num_steps}; lower --config.train.warmup_steps.")
  return problems


def _optimizer_problems(t: ml_collections.ConfigDict, nonfinite: set[str]) -> list[str]:
  """Adam's hyperparameters, the batch and the non-finite policy (``nonfinite``:
  the keys :func:`nonfinite_problems` refused, not checked again)."""
  problems = []
  for key in ("adam_b1", "adam_b2"):
    if f"train.{key}" not in nonfinite and not 0.0 <= t[key] < 1.0:
      problems.append(f"train.{key}={t[key]} must be in [0, 1) (Adam's decay rate).")
  if "train.adam_eps" not in nonfinite and not 0.0 < t.adam_eps:
    problems.append(f"train.adam_eps={t.adam_eps} must be > 0.")
  if t.global_batch < 1:
    problems.append(f"train.global_batch={t.global_batch} must be >= 1.")
  if t.nonfinite not in NONFINITE_POLICIES:
    problems.append(f"train.nonfinite={t.nonfinite!r}: use one of {NONFINITE_POLICIES}.")
  if t.prefetch < 0:
    problems.append(f"train.prefetch={t.prefetch} must be >= 0 (0 = no background thread).")
  if t.max_skipped_steps < 1:
    problems.append(f"train.max_skipped_steps={t.max_skipped_steps} must be >= 1.")
  return problems


def model_config(config: ml_collections.ConfigDict, n_token: int) -> ModelConfig:
  """The training :class:`ModelConfig` of ``config.model`` for a vocabulary.

  Raises:
    ConfigError: the model settings do not fit this vocabulary (e.g.
      cutoffs >= n_token), or are invalid.
  """
  try:
    return ModelConfig(n_token=n_token, **config.model.to_dict())
  except ValueError as err:
    raise ConfigError(f"Invalid config for a vocabulary of {n_token:,}: {err}") from None


def set_model_config(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> None:
  """Writes every field of ``model_cfg`` but n_token into ``config.model``
  (the inverse of :func:`model_config`; used by the converter)."""
  fields = dataclasses.asdict(model_cfg)
  fields.pop("n_token")
  fields["d_embed"] = int(fields["d_embed"] or 0)
  config.model.update({k: tuple(v) if isinstance(v, Sequence) and not isinstance(v, str) else v
                       for k, v in fields.items()})
