r"""Writes tests/fixtures/babilong/ by running the authors' BABILong code.

    python scripts/make_babilong_fixtures.py CHECKOUT

BABILong (Kuratov et al. 2024) builds its samples with
``babilong/babilong_utils.py`` of booydar/babilong (Apache-2.0):
``TaskDataset`` (bAbI files), ``SentenceSampler`` (background sentences,
NLTK Punkt) and ``NoiseInjectionDataset`` (facts among them).  CHECKOUT is a
checkout of that repository (or a folder holding ``babilong/
babilong_utils.py``, e.g. ``git --git-dir=MIRROR archive HEAD babilong |
tar -x``).  Their module imports pandas, nltk and torch: run this in an
environment that has them (``pip install pandas nltk torch transformers``).

Inputs written (so the test reads exactly what their code read):

  qa{1..5}_*_{train,test}.txt  bAbI-format files
                               (``transformer_xl.data.babi_like``, seeds 0/1,
                               8 train and 6 test stories each);
  noise_{train,test}.json      background documents: sentences drawn from a
                               small vocabulary, with abbreviations ("Mr.",
                               "St."), line breaks inside sentences, short
                               sentences and empty documents (what Punkt and
                               the length filter must handle);
  tokenizer.json               a byte-level BPE (``tokenizers``) trained on the
                               above, with ``<|endoftext|>``.

Expected (``expected.json``), per case: for the first samples of the test
file in index order, their ``input_tokens``, ``question_tokens``,
``target_tokens`` and ``fact_positions``, the question and answer texts, and
``len(dataset)``; the cases: each of qa1-qa5 with the facts anywhere, qa1 with
the facts placed (``task_start_pct`` 0.2, ``task_end_pct`` 0.6, their
``max_sentence_len``), qa2 with ``max_n_facts``, qa1 with the curriculum
(a list of sample sizes, ``mixed_length_ratio`` 0.3), and one with another
seed.  Their ``SentenceSampler(shuffle=True, random_seed=seed)`` and
``NoiseInjectionDataset(random_seed=seed)`` as their run script builds the
test set; their tokenizer is ``transformers.PreTrainedTokenizerFast`` of
the same ``tokenizer.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "babilong"
sys.path.insert(0, str(REPO))

from transformer_xl.data import babi_like, babilong_sources  # noqa: E402

WORDS = (
    "the of and a to in he was that his it with as had for on at by her she which from "
    "they were be this but not all have one said upon old man house day long time door "
    "little great night hand eyes"
).split()
CASES = {  # name -> (task, sample_size, start, end, max_n_facts, sizes, ratio, seed, n)
    "qa1": ("qa1", 120, None, None, None, None, 0.0, 42, 12),
    "qa2": ("qa2", 160, None, None, None, None, 0.0, 42, 8),
    "qa3": ("qa3", 220, None, None, None, None, 0.0, 42, 6),
    "qa4": ("qa4", 100, None, None, None, None, 0.0, 42, 5),
    "qa5": ("qa5", 120, None, None, None, None, 0.0, 42, 8),
    "qa1_placed": ("qa1", 400, 0.1, 0.8, 8, None, 0.0, 42, 10),
    "qa2_max_facts": ("qa2", 160, None, None, 10, None, 0.0, 42, 8),
    "qa1_curriculum": ("qa1", [60, 100, 140], None, None, None, None, 0.3, 42, 12),
    "qa1_seed7": ("qa1", 120, None, None, None, None, 0.0, 7, 12),
}


def noise_documents(seed: int, n: int) -> list[str]:
  """Documents of pseudo-English sentences (and one empty document)."""
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(n):
    if d == 2:
      docs.append("")
      continue
    sentences = []
    for _ in range(int(rng.integers(30, 60))):
      words = [WORDS[i] for i in rng.integers(len(WORDS), size=int(rng.integers(2, 18)))]
      if rng.random() < 0.15:
        words.insert(int(rng.integers(len(words))), "Mr. Holmes")
      if rng.random() < 0.1:
        words.insert(int(rng.integers(len(words))), "St.\nJames")
      end = ".!?"[int(rng.integers(3))]
      sentences.append(" ".join(words).capitalize() + end)
    docs.append(" ".join(sentences))
  return docs


def write_inputs() -> None:
  """The bAbI files, the noise and the tokenizer (see the module docstring)."""
  OUT.mkdir(parents=True, exist_ok=True)
  for task in ("qa1", "qa2", "qa3", "qa4", "qa5"):
    babi_like.write_task(OUT, task, train_stories=8, test_stories=6, seed=0)
  noise = {"train": noise_documents(0, 6), "test": noise_documents(1, 6)}
  for split, docs in noise.items():
    (OUT / f"noise_{split}.json").write_text(json.dumps(docs, indent=0) + "\n")
  texts = noise["train"] + noise["test"]
  texts += [p.read_text() for p in sorted(OUT.glob("qa*_*.txt"))]
  (OUT / "tokenizer.json").write_text(babi_like.train_tokenizer(texts, vocab_size=400))


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print(__doc__.split("\n\n")[1])
    return 2
  sys.path.insert(0, str(Path(argv[0]).resolve()))
  from babilong import babilong_utils as theirs  # pylint: disable=import-outside-toplevel
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  write_inputs()
  tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(OUT / "tokenizer.json"))
  noise_test = [{"text": t} for t in json.loads((OUT / "noise_test.json").read_text())]
  expected = {}
  for case, (task, size, start, end, max_facts, _, ratio, seed, n) in CASES.items():
    path = next(OUT.glob(f"{task}_{babilong_sources.TASK_NAMES[task]}_test.txt"))
    task_ds = theirs.TaskDataset(str(path), max_n_facts=max_facts)
    max_sentence_len = None
    if start is not None:
      max_sentence_len = int((end - start) * 0.5 * size)
    sampler = theirs.SentenceSampler(
        noise_test,
        tokenizer=tokenizer,
        max_sentence_len=max_sentence_len,
        shuffle=True,
        random_seed=seed,
    )
    ds = theirs.NoiseInjectionDataset(
        task_dataset=task_ds,
        noise_sampler=sampler,
        tokenizer=tokenizer,
        sample_size=size,
        mixed_length_ratio=ratio,
        task_start_pct=start,
        task_end_pct=end,
        random_seed=seed,
    )
    samples = []
    for i in range(min(n, len(ds))):
      s = ds[i]
      samples.append(
          {
              "input_tokens": [int(t) for t in s["input_tokens"]],
              "question_tokens": [int(t) for t in s["question_tokens"]],
              "target_tokens": [int(t) for t in s["target_tokens"]],
              "fact_positions": [int(p) for p in s["fact_positions"]],
              "question": str(s["question"]),
              "answer": str(s["answer"]),
              "facts": [str(f) for f in s["facts"]],
          }
      )
    expected[case] = {
        "task": task,
        "sample_size": size,
        "task_start_pct": start,
        "task_end_pct": end,
        "max_n_facts": max_facts,
        "mixed_length_ratio": ratio,
        "seed": seed,
        "len": len(ds),
        "samples": samples,
    }
    print(f"{case}: {len(samples)} samples of {len(ds)}")
  (OUT / "expected.json").write_text(json.dumps(expected) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main(sys.argv[1:]))
