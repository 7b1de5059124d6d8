r"""text8, 24-layer large model (reference run_text8_large.sh; the enwik8_24l model).

Dai et al. 2019, Table 3: 1.08 bpc on the text8 test set with 277M parameters.

    python -m transformer_xl.main --config=configs/text8_24l.py --workdir=$HOME/txl/text8_24l
    python -m transformer_xl.main --config=configs/text8_24l.py --workdir=$HOME/txl/text8_24l --mode=eval

Expected: test 1.08 bpc (paper).  Not yet reproduced with this code: it
needs a TPU pod slice or many GPUs (400k steps of batch 64 x 768 tokens).
On the reference's 2x16 TPU cores use the slice preset

    --config=configs/text8_24l.py:v3-32

(global batch 64 = 2 rows per core, bfloat16 compute, remat; see
transformer_xl/presets.py).  The model has 277,050,395 (27 symbols) parameters
(start-up prints the count).  Data: text8.zip is downloaded from
http://mattmahoney.net/dc/text8.zip, or put it in the tfds manual dir /
--config.data.manual_dir.
"""

from transformer_xl import default_config, presets


def get_config(preset=None):
  c = default_config.get_config()
  c.data.dataset = "text8"
  c.model.update(
      n_layer=24,
      d_model=1024,
      n_head=8,
      d_head=128,
      d_inner=3072,
      dropout=0.15,
      dropatt=0.15,
      tgt_len=768,
      mem_len=768,
  )
  c.train.update(global_batch=64, num_steps=400_000, warmup_steps=4000, learning_rate=2.5e-4)
  c.eval.update(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True, global_batch=8)
  c.paper.update(n_params=int(277e6), result="1.08 bpc (test)")
  return presets.apply_slice(c, preset)
