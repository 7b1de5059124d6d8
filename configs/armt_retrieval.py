r"""Associative retrieval with a curriculum over pairs, at the ARMT authors' recipe.

Rodkin et al. 2024 (ARMT, arXiv 2407.04841, Sec. 4.1) and their
``scripts/associative_retrieval/finetune_amt_ar-value_cur.sh`` (RMT:
``finetune_rmt_ar-value_cur.sh``): a backbone of 4 layers, 4 heads, hidden
128; 4 memory tokens, d_mem 64; one key-value pair per segment
(``data.dataset="synthetic:armt_retrieval"``, their token ids and layout:
``data/armt_retrieval.py``; segments of key + 3 tokens); a curriculum over the number of pairs 1, 2,
3, 5, 10, 20, 40, 50, 50, 200 (keys of 1 symbol of 16 up to 10 pairs, of
2 from 20, of 3 from the second 50), each stage from the last one's
weights with a fresh AdamW (lr 3e-4, weight decay 1e-3, warmup a tenth of
the stage, linear decay), 2,000 then 10,000 iterations (15,000 for 200
pairs), total batch 512, early stop at exact match 1.0 or 30 validations
without improvement, every segment backpropagated (``--k2`` = all).  Here
on this package's Transformer-XL (relative attention, d_head 32, d_inner
512); the memory variants per segment of 4 tokens:

* ``:armt`` (default): ARMT, 4 memory tokens, d_mem 64 (state per layer: a
  384 x 128 matrix and its 384 normalisers, 49,536 numbers);
* ``:tokens``: RMT's memory tokens (read and write, at the end), 4 of them:
  as many as ARMT's;
* ``:tokens32``: their RMT script's 32 memory tokens
  (``finetune_rmt_ar-value_cur.sh``: ``MEMORY_SIZE=32``; its early-stopping
  patience is 50 validations, kept);
* ``:xl``: Transformer-XL's cache of one segment (4 states per layer);
* ``:xl_bytes``: a cache of 387 states per layer, the same numbers per
  layer as ARMT's state: with segments of 4 tokens it reaches the last 96
  pairs, i.e. every pair of the stages up to 50;
* ``:knn``: a kNN memory (Wu et al. 2022) at the third layer over a store
  of 1,024 entries per head beside a one-segment cache;
* ``:none``: no memory (each segment alone).

Their optimizer is kept: AdamW (weight decay 1e-3), the linear schedule
with warmup, each gradient value clipped at 1.0; and their
``--vary_n_segments`` (``train.vary_n_segments``: each batch's number of
pairs drawn up to the stage's, its last pairs kept).  Every memory takes
one optimizer step per batch of whole examples (the gradient crossing the
segments for ARMT and the tokens; each segment's own for the others).
Departures, said: validation at the stage's full number of pairs (theirs
varies it as training does), batch 64 instead of 512 and 10,000 training examples per stage instead of
their 1,000,000 (a CPU's budget: ``results/memory_curriculum``).

    python -m transformer_xl.main --config=configs/armt_retrieval.py:armt --workdir=workdirs/ar
    # stages in workdirs/ar/stages/NN; the capacity curve in workdirs/ar/eval_results.json
"""

from transformer_xl import default_config, errors

SEGMENT = 4  # their segment_size with keys of 1 symbol: key, SEP, value, EOS
# (pairs, key symbols, steps): their NUMS_PAIRS, KEY_SIZES, ITERSS.
STAGES = (
    (1, 1, 2_000),
    (2, 1, 10_000),
    (3, 1, 10_000),
    (5, 1, 10_000),
    (10, 1, 10_000),
    (20, 2, 10_000),
    (40, 2, 10_000),
    (50, 2, 10_000),
    (50, 3, 10_000),
    (200, 3, 15_000),
)
VARIANTS = ("armt", "tokens", "tokens32", "xl", "xl_bytes", "knn", "none")


def stage(pairs: int, key_size: int, steps: int, variant: str) -> str:
  """One ``train.curriculum`` entry: the pairs, key size, budget, warmup (a
  tenth) and the linear decay's end (twice the budget: theirs); a segment of ``key_size + 3`` tokens (their
  ``BLOCK_SIZE``; a one-segment cache follows it); one step per batch of
  whole examples of up to ``pairs`` pairs (``mem_backprop_depth``)."""
  seg = key_size + 3
  s = (
      f"data.synthetic_num_pairs={pairs} data.synthetic_key_size={key_size} "
      f"train.num_steps={steps} train.warmup_steps={steps // 10} "
      f"train.schedule_steps={2 * steps}"
  )
  if key_size != 1:
    s += f" model.tgt_len={seg} eval.tgt_len={seg}"
    if variant in ("xl", "knn"):
      s += f" model.mem_len={seg} eval.mem_len={seg}"
  return s + f" train.mem_backprop_depth={pairs}"


def get_config(variant: str = "armt"):
  if variant not in VARIANTS:
    raise errors.ConfigError(
        f"configs/armt_retrieval.py:{variant}: use one of {', '.join(':' + v for v in VARIANTS)}."
    )
  c = default_config.get_config()
  c.data.update(
      dataset="synthetic:armt_retrieval",
      synthetic_num_pairs=1,
      synthetic_key_size=1,
      synthetic_value_size=1,
      synthetic_train_size=10_000,
      synthetic_valid_size=1_000,
      synthetic_test_size=1_000,
  )
  c.model.update(
      n_layer=4,
      d_model=128,
      n_head=4,
      d_head=32,
      d_inner=512,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=SEGMENT,
      mem_len=0,
      same_length=False,
      cutoffs=(),
      div_val=1,
      tie_weight=True,
      init_std=0.02,
  )
  if variant == "armt":
    c.model.memory = "armt"
    c.model.armt.update(num_mem_tokens=4, d_mem=64)
  elif variant in ("tokens", "tokens32"):
    n = 32 if variant == "tokens32" else 4
    c.model.tokens.update(num_mem_tokens=n, mem_at_end=True, read_mem_from_cache=True)
  elif variant == "xl":
    c.model.mem_len = SEGMENT
  elif variant == "xl_bytes":
    c.model.mem_len = 387  # 49,536 / 128: ARMT's state per layer
  elif variant == "knn":
    c.model.mem_len = SEGMENT
    c.model.memory = "knn"
    c.model.knn.update(memory_size=1024, num_neighbors=32, layers=(2,), retrieval="exact")
  c.train.update(
      global_batch=64,
      learning_rate=3e-4,
      min_lr=0.0,
      schedule="linear",  # get_linear_schedule_with_warmup
      weight_decay=1e-3,  # AdamW
      clip=float("inf"),
      clip_value=1.0,  # --clip_grad_value 1.0
      log_every=50,
      eval_every=250,  # their valid_interval
      eval_max_steps=0,
      stop_metric="answer_accuracy",  # their exact_match of the greedy answer
      stop_target=1.0,  # their desired_metric
      stop_patience=50 if variant == "tokens32" else 30,  # their early_stopping_patience
      # One step per batch of whole examples for every memory (equal optimizer steps;
      # the gradient crosses segments for armt and tokens), their --vary_n_segments.
      bptt_bp=True,
      vary_n_segments=True,
      curriculum=tuple(stage(p, k, n, variant) for p, k, n in STAGES),
  )
  n = STAGES[0][2]
  c.train.update(num_steps=n, warmup_steps=n // 10, schedule_steps=2 * n)  # stage 1's
  c.train.mem_backprop_depth = STAGES[0][0]
  c.eval.update(
      tgt_len=SEGMENT, mem_len=c.model.mem_len, clamp_len=0, same_length=False, global_batch=50
  )
  c.checkpoint.update(every_steps=250, max_to_keep=2)
  return c
