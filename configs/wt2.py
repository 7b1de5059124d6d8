r"""WikiText-2 with adaptive input and softmax, sized for a CPU.

    python -m transformer_xl.main --config=configs/wt2.py --workdir=workdirs/wt2 \
        --config.data.manual_dir=../shared/data/wikitext-2
    python -m transformer_xl.main --config=configs/wt2.py --workdir=workdirs/wt2 --mode=eval \
        --config.data.manual_dir=../shared/data/wikitext-2

The model: 4 layers, d_model 128, 4x32 heads, d_inner 512, tgt_len =
mem_len = 48; adaptive input and softmax over the 33,278 words with cutoffs
[2000, 8000], div_val 2 (cluster sizes 128, 64, 32), tied weights and tail
projections: 2,384,320 parameters.  Eval with tgt_len 48, mem_len 192,
same_length.  Expected result: see docs/results.md (2 CPU cores).
"""

from transformer_xl import default_config


def get_config():
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
      tgt_len=48,
      mem_len=48,
      cutoffs=(2000, 8000),
      div_val=2,
      tie_weight=True,
      tie_projs=(False, True, True),
  )
  c.train.update(
      global_batch=16,
      num_steps=3000,
      warmup_steps=100,
      learning_rate=1e-3,
      log_every=100,
      eval_every=1000,
  )
  c.eval.update(tgt_len=48, mem_len=192, clamp_len=0, same_length=True, global_batch=16)
  c.checkpoint.update(every_steps=1000, max_to_keep=2)
  return c
