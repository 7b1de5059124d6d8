"""The full configuration schema with defaults; configs/*.py start from it.

Every key that a config file or a ``--config.key=value`` flag may set is
defined here, and :func:`get_config` locks the dict so that a misspelt key is
an error instead of a silently ignored setting.  Model keys use the
reference implementation's names (Dai et al. 2019, ``train.py`` arguments).
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Defaults: the enwik8 12-layer base model (reference ``run_enwik8_base.sh``)."""
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048,
      dropout=0.1, dropatt=0.0,
      tgt_len=512, mem_len=512, ext_len=0, clamp_len=0, same_length=False,
      pre_lnorm=False, untie_r=False, tie_weight=True, attn_type=0,
      init_std=0.02,
      dtype="float32",   # compute dtype: "float32" or "bfloat16" (params stay float32)
      remat="none",      # "none" | "full" | "dots"
      # Adaptive input / softmax (Baevski & Auli 2018; Grave et al. 2016), reference names:
      d_embed=0,         # embedding size of the first cluster; 0 = d_model
      div_val=1,         # cluster i embeds in d_embed // div_val**i dims
      cutoffs=(),        # e.g. --config.model.cutoffs="(20000, 40000, 200000)"; () = dense softmax
      tie_projs=(),      # () or len(cutoffs)+1 bools, e.g. "(False, True, True, True)"
      proj_init_std=0.01,
  ))

  c.data = ml_collections.ConfigDict(dict(
      dataset="enwik8",  # enwik8 | text8 | ptb | ptb_char | wikitext2 | wikitext103
      data_dir=ml_collections.FieldReference(None, field_type=str),    # tfds data dir (default ~/tensorflow_datasets)
      manual_dir=ml_collections.FieldReference(None, field_type=str),  # where source files already on disk are
      download=True,
      verify_checksums=True,
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
  ))

  c.eval = ml_collections.ConfigDict(dict(
      tgt_len=128, mem_len=512, clamp_len=0, same_length=True,
      global_batch=10,       # reference eval_batch_size
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
