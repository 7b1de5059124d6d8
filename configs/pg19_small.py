r"""PG-19 (Rae et al. 2020): a small byte-level Transformer-XL, whole books evaluated.

Offline, over tfds's mock PG-19 (64 generated books per split; no download,
no TensorFlow; ``scripts/mock_tfds.py``), a few minutes on 2 CPU cores:

    python scripts/mock_tfds.py --config=configs/pg19_small.py --workdir=/tmp/txl_pg19_small
    python scripts/mock_tfds.py --workdir=/tmp/txl_pg19_small --mode=eval

On the real PG-19 (tfds ``pg19`` 0.1.1: 28,602 / 50 / 100 books, about
11 GB of text; tfds prepares it the first time from
gs://deepmind-gutenberg, which needs TensorFlow and access to Google Cloud
Storage; not tried here: offline it stops within seconds with one
``error:`` line), the same without the script:

    python -m transformer_xl.main --config=configs/pg19_small.py --workdir=/tmp/txl_pg19
    python -m transformer_xl.main --workdir=/tmp/txl_pg19 --mode=eval

Each book is a document (a tfds example, ``data.text_key="book_text"``);
training resets the memory at book boundaries (``data.documents="reset"``),
and evaluation scores every book from an empty memory to its end
(``eval.documents="whole"``), writing to ``eval_results.json`` each
split's and each book's loss, bits per byte and word-level perplexity
(exp(total NLL / whitespace-separated words), PG-19's measure).  The
model: 2 layers, d_model 64, 2x32 heads, d_inner 256, tgt_len = mem_len =
64 bytes; eval tgt_len 64, mem_len 256, same_length.  No result is claimed:
the mock books are random letters, and this model is far too small for the
real books (the paper's Transformer-XL: 36.3 test word-level perplexity, 36
layers; ``configs/compressive_pg19.py`` is the paper-sized config).
"""

from transformer_xl import default_config


def get_config():
  c = default_config.get_config()
  c.data.update(
      dataset="tfds:pg19",
      text_key="book_text",
      tfds_splits="train,validation,test",
      tokenizer="byte",  # every book's text, no vocabulary to build
      documents="reset",  # the memory does not cross books
  )
  c.model.update(
      n_layer=2,
      d_model=64,
      n_head=2,
      d_head=32,
      d_inner=256,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=64,
      mem_len=64,
  )
  c.train.update(
      global_batch=8,
      num_steps=200,
      warmup_steps=20,
      learning_rate=1e-3,
      log_every=50,
      eval_every=100,
  )
  c.eval.update(
      tgt_len=64, mem_len=256, clamp_len=0, same_length=True, global_batch=8, documents="whole"
  )
  c.checkpoint.update(every_steps=100, max_to_keep=2)
  return c
