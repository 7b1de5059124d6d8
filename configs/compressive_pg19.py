r"""PG-19, the 36-layer Compressive Transformer (Rae et al. 2020, Sec. 5.1).

Rae et al. 2020, Table 3: 33.6 test word-level perplexity (43.4 valid); their
36-layer Transformer-XL with an attention window of 1,024: 36.3 (45.5).

    python -m transformer_xl.main --config=configs/compressive_pg19.py --workdir=$HOME/txl/cmp_pg19
    python -m transformer_xl.main --workdir=$HOME/txl/cmp_pg19 --mode=eval

The paper trained on 256 TPU v3 cores with a total batch of 512: the slice
preset ``--config=configs/compressive_pg19.py:v3-256``.  The data are tfds's
``pg19`` (28,602 / 50 / 100 books; tfds prepares them the first time from
gs://deepmind-gutenberg, which needs TensorFlow and Google Cloud Storage);
each book is a document: training resets the memory at book boundaries and
evaluation scores every book from an empty memory to its end
(``eval.documents="whole"``), with word-level perplexity = exp(total NLL /
whitespace-separated words of the split), the paper's measure (Sec. 4.2).
``configs/pg19_small.py`` is a CPU-sized model over the same data.

The paper's settings, and where this config departs from them:

* Model (Sec. 5.1): 36 layers; window, memory and compressed memory 512
  (tgt_len = mem_len = cmem_len = 512); compression rate c = 2.  The
  compression function is not named for PG-19: a 1D convolution with the
  attention-reconstruction loss here (the best of Table 5 on enwik8, the
  one of the WikiText-103 model).
* Vocabulary: a 32,000-subword vocabulary trained on the training books
  (the paper: tfds's SubwordTextEncoder, part of TensorFlow; here
  SentencePiece's unigram model, ``data.tokenizer="sentencepiece"``, which
  gives other subwords of the same count: word-level perplexity does not
  depend on the subword split, token-level perplexity does).
* Optimisation (Sec. 5): Adam, a linear warmup of 16,000 steps to 3e-4,
  then a cosine decay to 1e-6 over 500,000 steps (num_steps = 516,000);
  global-norm clipping at 0.1; batch 512.  The paper's run converged after
  about 100 billion subword tokens (about 380,000 steps of 512 x 512).
  Not reproduced: the update period of 4 steps after 60,000 iterations
  (Sec. 5.5.1).  The compression network is clipped apart from the
  language model (their separate optimiser, with the same Adam settings).
* Not stated in the paper's text: the width and dropout.  This config
  uses its WikiText-103 model's width (d_model 1024, 16 heads of 64, MLP
  4096), a dense tied softmax over the 32,000 subwords and dropout 0.1 /
  0.0: a choice, not the paper's.  No parameter count is reported (start-up
  prints ours: 599,401,728 with 32,000 subwords).

Not reproduced with this code (it needs a TPU slice and the real data).
"""

from transformer_xl import default_config, presets


def get_config(preset=None):
  c = default_config.get_config()
  c.data.update(
      dataset="tfds:pg19",
      text_key="book_text",
      tfds_splits="train,validation,test",
      tokenizer="sentencepiece",
      vocab_size=32000,
      documents="reset",
  )
  c.model.update(
      n_layer=36,
      d_model=1024,
      n_head=16,
      d_head=64,
      d_inner=4096,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=512,
      mem_len=512,
      tie_weight=True,
      memory="compressive",
  )
  c.model.compressive.update(cmem_len=512, cmem_ratio=2, cmem_fn="conv")
  c.train.update(
      global_batch=512,
      num_steps=516_000,
      warmup_steps=16_000,
      learning_rate=3e-4,
      min_lr=1e-6,
      clip=0.1,
  )
  c.eval.update(
      tgt_len=512,
      mem_len=512,
      clamp_len=0,
      same_length=False,
      global_batch=8,
      documents="whole",
  )
  c.paper.update(result="33.6 word-level ppl (test)")
  return presets.apply_slice(c, preset)
