r"""Quickstart: a small Transformer-XL on Penn Treebank, minutes on a laptop CPU.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl_quickstart
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl_quickstart \
        --mode=eval

(The PTB files are downloaded from Mikolov's page; with
--config.data.manual_dir=DIR they are read from a local copy of
ptb.{train,valid,test}.txt.)  The model: 4 layers, d_model 128, 4x32 heads, d_inner
512, tgt_len = mem_len = 32; eval with tgt_len 32, mem_len 128, same_length.
Expected result: see docs/results.md (measured on 2 CPU cores).
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.dataset = "ptb"
  c.model.update(
      n_layer=4,
      d_model=128,
      n_head=4,
      d_head=32,
      d_inner=512,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=32,
      mem_len=32,
  )
  c.train.update(
      global_batch=16,
      num_steps=2000,
      warmup_steps=100,
      learning_rate=1e-3,
      log_every=100,
      eval_every=1000,
      eval_max_steps=0,
  )
  c.eval.update(tgt_len=32, mem_len=128, clamp_len=0, same_length=True, global_batch=16)
  c.checkpoint.update(every_steps=1000, max_to_keep=2)
  return c
