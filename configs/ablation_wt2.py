r"""The ablation of Dai et al. 2019, Table 6, at CPU scale on WikiText-2.

One file, one variant per config argument (like the TPU slice presets):

    python -m transformer_xl.main --config=configs/ablation_wt2.py:xl \
        --workdir=workdirs/ablation/xl --config.data.manual_dir=../shared/data/wikitext-2
    python -m transformer_xl.main --config=configs/ablation_wt2.py:xl \
        --workdir=workdirs/ablation/xl --config.data.manual_dir=../shared/data/wikitext-2 \
        --mode=eval

Variants (recurrence / encoding / loss, as the rows of Table 6):

  xl             yes  Transformer-XL (attn_type 0)         full
  xl_half        yes  Transformer-XL                       half
  shaw           yes  Shaw et al. 2018 (attn_type 1)       full
  no_recurrence  no   Transformer-XL                       full
  vaswani_half   no   Vaswani et al. 2017 (attn_type 2)    half
  alrfou_half    no   Al-Rfou et al. 2018 (attn_type 3)    half
  vanilla        no   Al-Rfou et al. 2018                  half, evaluated with the
                                                           sliding window (stride 1)

"vanilla" is the Transformer of Al-Rfou et al. (the paper's "Transformer
(128M)" row): it trains exactly what "alrfou_half" trains and differs only
in its evaluation, every token scored by a fresh pass over a window of its
previous tokens (``eval.method="sliding"``, the baseline of Tables 8 and 9).
Every variant has the same backpropagation length (tgt_len 32), batch,
steps, optimizer and model size: 4 layers, d_model 128, 4x32 heads, d_inner
512, adaptive input and softmax over the 33,278 words (cutoffs [2000, 8000],
div_val 2, tied).  The variants differ only in their positional parameters:
2,384,320 parameters for Transformer-XL (its W_kR and u, v), 2,352,832 for
Shaw et al. (tables for 64 distances), 2,318,528 for Vaswani et al. (none)
and 2,334,912 for Al-Rfou et al. (tables for 32 positions); start-up prints
the count.  With recurrence mem_len = tgt_len, so
the training attention length is 64; without, 32.  The eval settings are
those of "PPL init" (the training attention length: with recurrence a
memory of 64 with same_length, so every query sees 64 keys; without, the
training's segments of 32); a longer attention at evaluation is a matter of
``--config.eval.mem_len`` (or ``--config.eval.window`` for "vanilla").
"""

from transformer_xl import default_config

# variant -> (attn_type, mem_len, loss_span, eval method)
VARIANTS = {
    "xl": (0, 32, "full", "segments"),
    "xl_half": (0, 32, "half", "segments"),
    "shaw": (1, 32, "full", "segments"),
    "no_recurrence": (0, 0, "full", "segments"),
    "vaswani_half": (2, 0, "half", "segments"),
    "alrfou_half": (3, 0, "half", "segments"),
    "vanilla": (3, 0, "half", "sliding"),
}


def get_config(variant="xl"):
  """The config of ``variant`` (a key of ``VARIANTS``).

  Raises:
    ValueError: an unknown variant (the message lists them).
  """
  if variant not in VARIANTS:
    raise ValueError(
        f"Unknown ablation variant {variant!r}; choose one of {list(VARIANTS)} "
        "(e.g. --config=configs/ablation_wt2.py:xl_half)."
    )
  attn_type, mem_len, loss_span, method = VARIANTS[variant]
  c = default_config.get_config()
  c.data.dataset = "wikitext2"
  c.model.update(
      n_layer=4,
      d_model=128,
      n_head=4,
      d_head=32,
      d_inner=512,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=32,
      mem_len=mem_len,
      attn_type=attn_type,
      cutoffs=(2000, 8000),
      div_val=2,
      tie_weight=True,
      tie_projs=(False, True, True),
  )
  c.train.update(
      global_batch=16,
      num_steps=2000,
      warmup_steps=100,
      learning_rate=1e-3,
      log_every=100,
      eval_every=1000,
      eval_max_steps=50,
      loss_span=loss_span,
  )
  # "PPL init": the training attention length; with recurrence every query
  # sees exactly 32 + 32 keys (same_length), without it is scored as trained.
  c.eval.update(
      method=method,
      tgt_len=32,
      mem_len=2 * mem_len,
      clamp_len=0,
      same_length=mem_len > 0,
      window=32,
      stride=1,
      global_batch=16,
  )
  c.checkpoint.update(every_steps=1000, max_to_keep=1)
  return c
