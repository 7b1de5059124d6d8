r"""BABILong qa1 with a recurrent memory, at the ARMT authors' settings.

Kuratov et al. 2024 (BABILong) and Rodkin et al. 2024 (ARMT) fine-tune GPT-2
(124M) with memory on BABILong: segments of 512 GPT-2 tokens, a curriculum
of 2, 3, 5, 8, 16, 32 segments (ARMT's ``scripts/babilong/
finetune_babilong_amt_cur.sh``: each stage from the last one's checkpoint,
10,000 steps, batch 64, AdamW at 1e-4 with a linear schedule, all segments
backpropagated, ``MAX_N_FACTS`` = sample size / 5), PG-19 as the
background.  This is that setting on this package's Transformer-XL with
GPT-2 small's shape (12 layers, d_model 768, 12 heads of 64, d_inner 3072,
GPT-2's tokenizer and vocabulary, tied embeddings), trained from scratch:
GPT-2's pretrained weights are not a Transformer-XL's, so the papers'
numbers (near 100% on qa1 to 16k tokens and beyond) are not what this
config will reach from scratch in the same steps.

    huggingface-cli download gpt2 tokenizer.json --local-dir gpt2
    python -m transformer_xl.main --config=configs/babilong.py:armt --workdir=$HOME/txl/babi2 \
        --config.data.manual_dir=$HOME/babi     # or let it download the bAbI archive
    python -m transformer_xl.main --config=configs/babilong.py:armt --workdir=$HOME/txl/babi3 \
        --config.data.babilong_sample_size=1536 --config.train.init_from=$HOME/txl/babi2
    python -m transformer_xl.main --config=configs/babilong.py:armt --workdir=$HOME/txl/babi3 \
        --mode=eval --config.data.babilong_sample_size=8192    # longer than trained

Variants (memory per segment of 512):

* ``:armt`` (default): ARMT, 10 memory tokens, d_mem 64, no cache (the
  authors' ``MEMORY_SIZE=10``, ``D_MEM=64``);
* ``:tokens``: RMT's memory tokens, 10 tokens, no cache;
* ``:xl``: Transformer-XL's cache of 512 states per layer.

Parameters: 139,019,101 / 130,752,337 / 130,744,657 (GPT-2 small: 124M;
ARMT's projections add 8.3M, the tokens 7,680).

The memory variants backpropagate through every segment of an example
(``train.mem_backprop_depth`` = segments - 1, ``bptt_bp``), so a stage with
more segments sets the depth too (``--config.train.mem_backprop_depth=2``
for 3 segments, ...).  Departures: Adam with a cosine schedule here (theirs
AdamW, linear), the package's fixed-length examples (docs/guide/babilong.md).
"""

from transformer_xl import default_config, errors

SEGMENT = 512


def get_config(variant: str = "armt"):
  c = default_config.get_config()
  c.data.update(
      dataset="babilong:qa1",
      tokenizer="pretrained:gpt2/tokenizer.json",
      babilong_noise="tfds:pg19",
      text_key="book_text",
      babilong_sample_size=2 * SEGMENT,
      babilong_max_n_facts=2 * SEGMENT // 5,
  )
  c.model.update(
      n_layer=12,
      d_model=768,
      n_head=12,
      d_head=64,
      d_inner=3072,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=SEGMENT,
      mem_len=0,
      same_length=False,
      tie_weight=True,
      div_val=1,
      cutoffs=(),
  )
  depth = 1  # two segments: backpropagation through the first
  if variant == "armt":
    c.model.memory = "armt"
    c.model.armt.update(num_mem_tokens=10, d_mem=64)
    c.train.update(mem_backprop_depth=depth, bptt_bp=True)
  elif variant == "tokens":
    c.model.tokens.update(num_mem_tokens=10, mem_at_end=True, read_mem_from_cache=True)
    c.train.update(mem_backprop_depth=depth, bptt_bp=True)
  elif variant == "xl":
    c.model.mem_len = SEGMENT
  else:
    raise errors.ConfigError(f"configs/babilong.py:{variant}: use :armt, :tokens or :xl.")
  c.train.update(
      global_batch=64,
      num_steps=10_000,
      warmup_steps=0,
      learning_rate=1e-4,
      min_lr=0.0,
      log_every=100,
      eval_every=1_000,
      eval_max_steps=0,
  )
  c.eval.update(
      tgt_len=SEGMENT,
      mem_len=c.model.mem_len,
      clamp_len=0,
      same_length=False,
      global_batch=16,
  )
  c.checkpoint.update(every_steps=1_000, max_to_keep=2)
  return c
