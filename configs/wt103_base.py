r"""WikiText-103, 16-layer base model (reference run_wt103_base.sh).

Dai et al. 2019, Table 1: 24.0 test perplexity with 151M parameters.

    python -m transformer_xl.main --config=configs/wt103_base.py --workdir=$HOME/txl/wt103_base
    python -m transformer_xl.main --config=configs/wt103_base.py --workdir=$HOME/txl/wt103_base --mode=eval

Expected: test 24.0 ppl (paper).  Not yet reproduced with this code (200k
steps of batch 60 x 150 tokens need accelerators).  The model has
151,107,538 parameters (start-up prints the count): adaptive input and
softmax with cutoffs [20000, 40000, 200000], div_val 1, output weights tied
to the embedding and the tail projections tied (tie_projs [F, T, T, T]).
Data: wikitext-103-v1.zip, downloaded or from the tfds manual dir /
--config.data.manual_dir.
"""

from transformer_xl import default_config


def get_config():
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
      mem_len=150,
      cutoffs=(20000, 40000, 200000),
      div_val=1,
      tie_weight=True,
      tie_projs=(False, True, True, True),
  )
  c.train.update(global_batch=60, num_steps=200_000, warmup_steps=0, learning_rate=2.5e-4)
  c.eval.update(tgt_len=64, mem_len=640, clamp_len=400, same_length=True, global_batch=10)
  c.paper.update(n_params=int(151e6), result="24.0 ppl (test)")
  return c
