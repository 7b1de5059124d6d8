r"""Penn Treebank (Mikolov's version), word level, a 24M-parameter model.

Dai et al. 2019, Table 5: 54.5 test perplexity with 24M parameters, using
variational dropout and weight averaging as AWD-LSTM does.  Those two
regularisers are not implemented here, so expect a higher perplexity from
this config; it has not been run to completion yet.

    python -m transformer_xl.main --config=configs/ptb.py --workdir=$HOME/txl/ptb \
        --config.data.manual_dir=../shared/data/ptb
    python -m transformer_xl.main --config=configs/ptb.py --workdir=$HOME/txl/ptb --mode=eval \
        --config.data.manual_dir=../shared/data/ptb

The model: 12 layers, d_model 400, 10x40 heads, d_inner 1000, tied
embedding, 23.4M parameters (start-up prints the count).
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.dataset = "ptb"
  c.model.update(
      n_layer=12,
      d_model=400,
      n_head=10,
      d_head=40,
      d_inner=1000,
      dropout=0.4,
      dropatt=0.2,
      tgt_len=70,
      mem_len=70,
  )
  c.train.update(
      global_batch=20,
      num_steps=60_000,
      warmup_steps=1000,
      learning_rate=2.5e-4,
      log_every=200,
      eval_every=2000,
  )
  c.eval.update(tgt_len=70, mem_len=280, clamp_len=0, same_length=True, global_batch=10)
  c.checkpoint.every_steps = 2000
  c.paper.update(n_params=int(24e6), result="54.5 ppl (test)")
  return c
