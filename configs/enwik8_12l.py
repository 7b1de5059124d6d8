r"""enwik8, 12-layer base model (reference run_enwik8_base.sh).

Dai et al. 2019, Table 2: 1.06 bpc on the enwik8 test set with 41M parameters.

    python -m transformer_xl.main --config=configs/enwik8_12l.py --workdir=$HOME/txl/enwik8_12l
    python -m transformer_xl.main --config=configs/enwik8_12l.py --workdir=$HOME/txl/enwik8_12l --mode=eval

Expected: test 1.06 bpc (paper).  Not yet reproduced with this code: this
needs accelerators (400k steps of batch 22 x 512 tokens).  The model has
41,082,112 parameters over all 256 byte values (41,055,436 with the
reference's 204-symbol vocabulary); start-up prints the count.  Data: enwik8.zip is downloaded from
http://mattmahoney.net/dc/enwik8.zip, or put it in the tfds manual dir /
--config.data.manual_dir.
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.dataset = "enwik8"
  c.model.update(
      n_layer=12,
      d_model=512,
      n_head=8,
      d_head=64,
      d_inner=2048,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=512,
      mem_len=512,
  )
  c.train.update(global_batch=22, num_steps=400_000, warmup_steps=0, learning_rate=2.5e-4)
  c.eval.update(tgt_len=80, mem_len=2100, clamp_len=820, same_length=True, global_batch=10)
  c.paper.update(n_params=int(41e6), result="1.06 bpc (test)")
  return c
