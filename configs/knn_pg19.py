r"""PG-19, the Memorizing Transformer (Wu et al. 2022, arXiv 2203.08913, Sec. 4).

One file, one variant per config argument (a store size, or none):

    python -m transformer_xl.main --config=configs/knn_pg19.py:knn_65k --workdir=$HOME/txl/knn65k
    python -m transformer_xl.main --workdir=$HOME/txl/knn65k --mode=eval
    # the paper's fine-tuning (Sec. 4.4): a model trained without a store, then given one
    python -m transformer_xl.main --config=configs/knn_pg19.py:xl --workdir=$HOME/txl/xl
    python -m transformer_xl.main --config=configs/knn_pg19.py:knn_65k --workdir=$HOME/txl/ft65k \
        --config.train.init_from=$HOME/txl/xl --config.train.num_steps=20000

Variants: ``xl`` (the baseline: Transformer-XL with a cache of one
segment), ``knn_8k``, ``knn_32k``, ``knn_65k``, ``knn_131k``, ``knn_262k``
(the same with a store of 8,192 ... 262,144 entries per row and head at the
9th layer: the paper's memory sizes, Sec. 4.2); ``VARIANT,v3-8`` adds a
slice preset (``presets.apply_slice``; the batch of 8 segments needs a
slice whose device count divides it: the paper ran on 32 TPU v3 cores,
with a batch this text does not know).
``--mode=eval`` of a kNN model scores each split with and without its
store (``without_knn`` in ``eval_results.json``).

The paper's settings (Sec. 4.1: "a 12-layer decoder-only transformer (with
and without Transformer-XL cache) with an embedding size of 1024, 8
attention heads of dimension 128, and an FFN hidden layer of size 4096 ...
k = 32 ... the 9th layer as the kNN augmented attention layer"), segments
of 512 tokens with a Transformer-XL cache of 512, as their code's gin
files (google-research/meliad, ``transformer/configs``: ``SEGMENT_LENGTH``
512, ``memory_layer_indices`` (-4,), dropout 0.05).  Their results are in
the paper's Table 4 (token-level perplexity per dataset and memory size)
and Fig. 3 (perplexity against memory size): compare a run of this config
with them there (their numbers are not copied here).

Where this config departs from them:

* Vocabulary: 32,000 SentencePiece pieces trained on the training books
  (theirs: T5's 32,128-entry vocabulary, ``pg19_tokens_t5.gin``); token
  perplexities of two vocabularies differ.
* Position encoding and attention: Transformer-XL's relative encoding and
  attention (theirs: T5 relative biases, normalised queries and keys with
  a learned scale); the store, its reads and the gate are the authors'
  (docs/guide/knn.md).
* Optimisation: Adam with a linear warmup of 1,000 steps to 3e-4 and a
  cosine decay to 3e-5 (theirs: Adafactor at 0.01 decaying to 0.001 over
  the same warmup, ``trainer_configuration.gin``); batch 8 segments
  (``base_transformer.gin``); 500,000 steps (a choice).
* Documents: the store of a row is not emptied at a book's start
  (``data.documents="stream"``: the kNN memory does not yet keep documents
  apart inside a segment); theirs starts each book from an empty store.

Parameters (start-up prints them; computed in ``tests/test_configs.py``):
196,490,496 for ``xl``, 196,490,688 with a store (the gate bias and scale,
8 each, in every one of the 12 layers).  Each store holds ``2 x 8 x S x
128`` values per row (bfloat16 with a slice preset): 1 GiB per row at
S = 262,144, 256 MiB at 65,536.

Not reproduced with this code (it needs a TPU slice and the real data).
"""

from transformer_xl import default_config, presets

# variant -> store entries per row and head (0: Transformer-XL, no store)
VARIANTS = {
    "xl": 0,
    "knn_8k": 8192,
    "knn_32k": 32768,
    "knn_65k": 65536,
    "knn_131k": 131072,
    "knn_262k": 262144,
}


def get_config(arg="knn_65k"):
  """The config of ``arg`` = ``VARIANT`` or ``VARIANT,PRESET`` (a slice).

  Raises:
    ValueError: an unknown variant (the message lists them) or preset.
  """
  variant, _, preset = arg.partition(",")
  if variant not in VARIANTS:
    raise ValueError(
        f"configs/knn_pg19.py: unknown variant {variant!r}; use one of {list(VARIANTS)}."
    )
  c = default_config.get_config()
  c.data.update(
      dataset="tfds:pg19",
      text_key="book_text",
      tfds_splits="train,validation,test",
      tokenizer="sentencepiece",
      vocab_size=32000,
  )
  c.model.update(
      n_layer=12,
      d_model=1024,
      n_head=8,
      d_head=128,
      d_inner=4096,
      dropout=0.05,
      dropatt=0.05,
      tgt_len=512,
      mem_len=512,
      tie_weight=True,
  )
  if VARIANTS[variant]:
    c.model.memory = "knn"
    c.model.knn.update(
        memory_size=VARIANTS[variant], num_neighbors=32, layers=(-4,), retrieval="bucketed"
    )
  c.train.update(
      global_batch=8,
      num_steps=500_000,
      warmup_steps=1000,
      learning_rate=3e-4,
      min_lr=3e-5,
  )
  c.eval.update(tgt_len=512, mem_len=512, clamp_len=0, same_length=False, global_batch=8)
  c.paper.update(result="Wu et al. 2022, Table 4 (token-level perplexity)")
  return presets.apply_slice(c, preset or None)
