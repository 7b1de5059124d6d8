r"""enwik8 with memory tokens (Bulatov et al. 2022, the Recurrent Memory Transformer).

The authors' limited-input setting (their README's "LM*" row: Transformer-XL
1.283, RMT 1.228 test bpc; the runs in their
``experiment_results/results_wt103_enwik8_all_parameters.csv``): the
reference's 12-layer enwik8 model (``run_enwik8_base.sh``: d_model 512, 8
heads of 64, d_inner 2048, dropout 0.1, dropatt 0, Adam 2.5e-4, 400,000
steps) on segments of 128 bytes, batch 64, evaluated on segments of 128
with the training memory, no same_length.

    python -m transformer_xl.main --config=configs/rmt_enwik8.py:rmt --workdir=$HOME/txl/rmt_enwik8
    python -m transformer_xl.main --workdir=$HOME/txl/rmt_enwik8 --mode=eval

Variants (a config argument):

* ``rmt`` (default): 10 memory tokens written at the end, no cache
  (``--num_mem_tokens 10 --mem_len 0 --mem_at_end``), backpropagation
  through 2 earlier segments (``--mem_backprop_depth 2``, no ``--bptt_bp``):
  1.22815 and 1.22394 bpc in their csv (two seeds); 41,060,556 parameters
  in their count (vocabulary 204).
* ``xl``: Transformer-XL with a cache of 10 states (``--mem_len 10``):
  1.2844 and 1.2823 (41,055,436 parameters).

Our vocabulary has 256 byte ids (theirs the 204 that occur), so start-up
prints 26,676 parameters more than theirs (52 ids x (512 + 1 bias)): with
their 204 the counts are equal, 41,060,556 and 41,055,436 (tested).  Not
reproduced with this code (it needs accelerators).
"""

from transformer_xl import default_config, errors

VARIANTS = {"rmt": (0, 10, 2), "xl": (10, 0, 0)}  # mem_len, num_mem_tokens, depth


def get_config(variant: str = "rmt"):
  if variant not in VARIANTS:
    raise errors.ConfigError(f"configs/rmt_enwik8.py:{variant}: use :rmt or :xl.")
  mem_len, tokens, depth = VARIANTS[variant]
  c = default_config.get_config()
  c.data.dataset = "enwik8"
  c.model.update(
      n_layer=12,
      d_model=512,
      n_head=8,
      d_head=64,
      d_inner=2048,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=128,
      mem_len=mem_len,
  )
  c.model.tokens.update(num_mem_tokens=tokens, mem_at_end=True, read_mem_from_cache=False)
  c.train.update(
      global_batch=64,
      num_steps=400_000,
      warmup_steps=0,
      learning_rate=2.5e-4,
      mem_backprop_depth=depth,
  )
  c.eval.update(tgt_len=128, mem_len=mem_len, clamp_len=0, same_length=False, global_batch=10)
  if variant == "rmt":
    c.paper.update(n_params=41_060_556, result="1.228 bpc (test; their csv: 1.22815, 1.22394)")
  else:
    c.paper.update(n_params=41_055_436, result="1.283 bpc (test; their csv: 1.2844, 1.2823)")
  return c
