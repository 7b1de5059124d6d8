r"""The copy task of the Recurrent Memory Transformer at its authors' setting.

Bulatov, Kuratov, Burtsev 2022 (arXiv 2207.06881, Sec. 4), their
``pytorch/run_copy.sh`` with ``--tgt_len 12 --num_mem_tokens 6`` (the
settings of their ``experiment_results/short_synthetic+MT.csv``): copy 24
symbols of 10 (``data.dataset="synthetic:copy"``, ids 2..11; an example is
the 24 symbols, the answer marker and the answer, the input twice: 72
positions, 48 of them the answer), in 6 segments of 12 (their
``n_chunks``); 4 layers, d_model 128, 4 heads of 64, d_inner 256, dropout
0.1, dropatt 0, tied weights, no same_length; Adam at 1e-4 (they halve it
when the validation loss stops falling, ``--scheduler dev_perf``, down to
1e-6; here a cosine from 1e-4 to 1e-6), clip 0.25, batch 32, 700,000 steps
(their csv; run_copy.sh: 250,000), validation every 12,000 steps.  The
loss covers the answer positions only, as theirs (``data/synthetic.py``).

Two variants, memory of 6 vectors either way:

* ``configs/copy_rmt.py:rmt`` (default): 6 memory tokens, no cache
  (``--num_mem_tokens 6 --mem_len 0``, read and write tokens, memory at the
  end).  Their csv: test accuracy 1.0 in 4 of 4 seeds.  Their
  ``train_synthetic.py`` backpropagates through all 6 segments of an
  example, one update per batch of examples (the tokens are never detached
  within an example, whatever ``--mem_backprop_depth``):
  ``train.mem_backprop_depth=5`` with ``train.bptt_bp=True`` here.
* ``configs/copy_rmt.py:xl``: Transformer-XL with a cache of 6 states
  (``--mem_len 6 --num_mem_tokens 0``).  Their csv: 0.657, 0.298, 0.355,
  0.856 over 4 seeds.  With neither (``--config.model.mem_len=0``) their
  csv gives 0.102: chance, 1 in 10.

Their accuracy is per answer token; for copy, whose answer spans several
segments, it is the accuracy of greedy decoding (``train_synthetic.py``,
"no teacher forcing"): ``--mode=eval`` writes it as
``greedy_token_accuracy``, beside ``answer_token_accuracy`` (teacher-forced)
and ``answer_accuracy`` (whole answers right).  See docs/guide/synthetic_tasks.md.

    python -m transformer_xl.main --config=configs/copy_rmt.py:xl --workdir=workdirs/copy_xl
    python -m transformer_xl.main --config=configs/copy_rmt.py:xl --workdir=workdirs/copy_xl \
        --mode=eval
"""

from transformer_xl import default_config, errors


def get_config(variant: str = "rmt"):
  c = default_config.get_config()
  c.data.dataset = "synthetic:copy"  # seq_len 24, num_tokens 12, 10,000 / 1,000 / 2,000
  c.model.update(
      n_layer=4,
      d_model=128,
      n_head=4,
      d_head=64,
      d_inner=256,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=12,
      mem_len=0,
      same_length=False,
  )
  if variant == "rmt":
    c.model.tokens.update(num_mem_tokens=6, mem_at_end=True, read_mem_from_cache=True)
    # Their train_synthetic.py carries the tokens with their gradient through the
    # example's 6 segments, one update per example batch: a window of 6 here.
    c.train.update(mem_backprop_depth=5, bptt_bp=True)
  elif variant == "xl":
    c.model.mem_len = 6
  else:
    raise errors.ConfigError(f"configs/copy_rmt.py:{variant}: use :rmt or :xl.")
  c.train.update(
      global_batch=32,
      num_steps=700_000,
      warmup_steps=0,
      learning_rate=1e-4,
      min_lr=1e-6,
      seed=1234,
      log_every=1000,
      eval_every=12_000,
      eval_max_steps=0,
  )
  c.eval.update(
      tgt_len=12, mem_len=c.model.mem_len, clamp_len=0, same_length=False, global_batch=32
  )
  c.checkpoint.update(every_steps=12_000, max_to_keep=2)
  return c
