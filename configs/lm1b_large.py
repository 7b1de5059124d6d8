r"""One Billion Word, 24-layer large model (reference TPU script for lm1b large).

Dai et al. 2019, Table 4: 21.8 test perplexity with 0.8B parameters.

    python -m transformer_xl.main --config=configs/lm1b_large.py --workdir=$HOME/txl/lm1b_large
    python -m transformer_xl.main --config=configs/lm1b_large.py --workdir=$HOME/txl/lm1b_large --mode=eval

On the reference's 32x16 TPU cores use the slice preset

    --config=configs/lm1b_large.py:v3-512

(global batch 512 = 1 row per core, bfloat16 compute, remat; see
transformer_xl/presets.py).

Expected: test 21.8 ppl (paper).  Not yet reproduced with this code.
Adaptive input and softmax with cutoffs [60000, 100000, 640000], div_val 4,
untied projections, output weights tied to the embedding: 841,295,982
parameters, the closest to the paper's 0.8B (untied output weights would
give 977M).  lr 1e-4 as in the TPU script.
"""

from transformer_xl import default_config, presets


def get_config(preset=None):
  c = default_config.get_config()
  c.data.dataset = "lm1b"
  c.model.update(
      n_layer=24,
      d_model=1280,
      n_head=16,
      d_head=80,
      d_inner=8192,
      dropout=0.05,
      dropatt=0.05,
      tgt_len=32,
      mem_len=32,
      cutoffs=(60000, 100000, 640000),
      div_val=4,
      tie_weight=True,
      tie_projs=(False, False, False, False),
  )
  c.train.update(global_batch=512, num_steps=1_200_000, warmup_steps=30_000, learning_rate=1e-4)
  c.eval.update(tgt_len=32, mem_len=128, clamp_len=0, same_length=True, global_batch=16)
  c.paper.update(n_params=int(800e6), result="21.8 ppl (test)")
  return presets.apply_slice(c, preset)
