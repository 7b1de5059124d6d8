r"""WikiText-103 with memory tokens (Bulatov et al. 2022, the Recurrent Memory Transformer).

The reference's 16-layer WikiText-103 model (the authors' ``run_wt103_base.sh``:
d_model 410, 10 heads of 41, d_inner 2100, adaptive input and softmax,
dropout 0.1, dropatt 0, Adam 2.5e-4, 200,000 steps of batch 60) on segments
of 150 tokens, evaluated on segments of 150 with the training memory, no
same_length, as the runs of their
``experiment_results/results_wt103_enwik8_all_parameters.csv``.

    python -m transformer_xl.main --config=configs/rmt_wt103.py:rmt --workdir=$HOME/txl/rmt_wt103
    python -m transformer_xl.main --workdir=$HOME/txl/rmt_wt103 --mode=eval

Variants (a config argument):

* ``rmt`` (default): 25 memory tokens written at the end, no cache
  (``--num_mem_tokens 25 --mem_len 0 --mem_at_end``), backpropagation
  through 2 earlier segments (``--mem_backprop_depth 2``): 24.646, 25.204
  and 24.698 test ppl in their csv (three seeds; the best memory-token rows
  there); 151,117,788 parameters.  Their README's 23.99 ("RMT, limited
  input and memory size") is not among the csv's runs.
* ``xl``: Transformer-XL with a cache of 150 states (``--mem_len 150``):
  24.172, 24.071, 24.107 (their README: 24.12); 151,107,538 parameters.

Not reproduced with this code (it needs accelerators).
"""

from transformer_xl import default_config, errors

VARIANTS = {"rmt": (0, 25, 2), "xl": (150, 0, 0)}  # mem_len, num_mem_tokens, depth


def get_config(variant: str = "rmt"):
  if variant not in VARIANTS:
    raise errors.ConfigError(f"configs/rmt_wt103.py:{variant}: use :rmt or :xl.")
  mem_len, tokens, depth = VARIANTS[variant]
  c = default_config.get_config()
  c.data.dataset = "wikitext103"
  c.model.update(
      n_layer=16,
      d_model=410,
      n_head=10,
      d_head=41,
      d_inner=2100,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=150,
      mem_len=mem_len,
      cutoffs=(20000, 40000, 200000),
      div_val=1,
      tie_weight=True,
      tie_projs=(False, True, True, True),
  )
  c.model.tokens.update(num_mem_tokens=tokens, mem_at_end=True, read_mem_from_cache=False)
  c.train.update(
      global_batch=60,
      num_steps=200_000,
      warmup_steps=0,
      learning_rate=2.5e-4,
      mem_backprop_depth=depth,
  )
  c.eval.update(tgt_len=150, mem_len=mem_len, clamp_len=0, same_length=False, global_batch=10)
  if variant == "rmt":
    c.paper.update(n_params=151_117_788, result="24.65 ppl (test; their csv's best RMT row)")
  else:
    c.paper.update(n_params=151_107_538, result="24.12 ppl (test; their csv: 24.07-24.17)")
  return c
