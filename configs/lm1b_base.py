r"""One Billion Word, 18-layer base model (reference run_lm1b_base.sh).

Dai et al. 2019, Table 4: 23.5 test perplexity with 0.46B parameters.

    python -m transformer_xl.main --config=configs/lm1b_base.py --workdir=$HOME/txl/lm1b_base
    python -m transformer_xl.main --config=configs/lm1b_base.py --workdir=$HOME/txl/lm1b_base --mode=eval

Expected: test 23.5 ppl (paper).  Not yet reproduced with this code.
Adaptive input and softmax with cutoffs [60000, 100000, 640000], div_val 4,
untied projections and untied output weights: 466,507,618 parameters, the
paper's 0.46B (with the output weights tied it would be 358M).  Training
rows are streams of whole sentences in a new random order every epoch
(reference LMShuffledIterator); valid and test are held-out shard 00000, as
in the reference.
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.dataset = "lm1b"
  c.model.update(
      n_layer=18,
      d_model=1024,
      n_head=8,
      d_head=128,
      d_inner=4096,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=32,
      mem_len=32,
      cutoffs=(60000, 100000, 640000),
      div_val=4,
      tie_weight=False,
      tie_projs=(False, False, False, False),
  )
  c.train.update(global_batch=224, num_steps=500_000, warmup_steps=20_000, learning_rate=2.5e-4)
  c.eval.update(tgt_len=32, mem_len=128, clamp_len=0, same_length=True, global_batch=16)
  c.paper.update(n_params=int(460e6), result="23.5 ppl (test)")
  return c
