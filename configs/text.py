r"""Your own text files: a small Transformer-XL with a SentencePiece vocabulary.

    python -m transformer_xl.main --config=configs/text.py --workdir=/tmp/txl_text \
        --config.data.train_files='../shared/data/wikitext-2/wiki.train.tokens' \
        --config.data.valid_files='../shared/data/wikitext-2/wiki.valid.tokens' \
        --config.data.test_files='../shared/data/wikitext-2/wiki.test.tokens'
    python -m transformer_xl.main --workdir=/tmp/txl_text --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl_text --mode=generate --prompt='The history of'

(Without ``--config`` a mode reads the run's saved ``config.json``, files
included.)
Each ``*_files`` is a comma-separated list of glob patterns (plain or gzip
files; quote them so the shell does not expand them).  A SentencePiece
model of 8,000 pieces (unigram, byte fallback) is trained on the training
files the first time; the tokenised corpus is kept in the tfds data dir and
reused while the files and settings stay the same.  A document is a file
(``data.document_separator``, as the guide says; ``paragraph`` or ``line``
for shorter ones); ``data.documents="reset"`` keeps the memory from
crossing documents.  The model: 4 layers, d_model 128, 4x32 heads, d_inner
512, tgt_len = mem_len = 64; eval with tgt_len 64, mem_len 256,
same_length.  Expected result (the WikiText-2 files above, 2 CPU cores):
see the guide "Train on your own text" (docs/guide/own_text.md).
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.update(
      dataset="text",
      tokenizer="sentencepiece",
      vocab_size=8000,
      document_separator="file",  # as the guide (own_text.md) says: each file one document
      documents="stream",
  )
  c.model.update(
      n_layer=4,
      d_model=128,
      n_head=4,
      d_head=32,
      d_inner=512,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=64,
      mem_len=64,
  )
  c.train.update(
      global_batch=16,
      num_steps=2000,
      warmup_steps=100,
      learning_rate=1e-3,
      log_every=100,
      eval_every=1000,
  )
  c.eval.update(tgt_len=64, mem_len=256, clamp_len=0, same_length=True, global_batch=16)
  c.checkpoint.update(every_steps=1000, max_to_keep=2)
  return c
