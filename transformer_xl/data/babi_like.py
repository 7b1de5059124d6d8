"""bAbI-format stand-in files for tests and CPU studies (not the benchmark).

The real bAbI tasks (Weston et al. 2015, ``tasks_1-20_v1-2/en-10k``) are
what ``data.dataset="babilong:qaN"`` is meant to read.  Where they are
absent (this project's machines), ``write_task`` writes files in their
format, ``qaN_NAME_{train,test}.txt``, with stories of the same kinds for
qa1-qa5, drawn from a seed:

* qa1 (single supporting fact): people move between places; "Where is X?"
  is answered by X's last move.
* qa2 (two supporting facts): people also pick up and drop objects; "Where
  is the OBJECT?" is answered by the place of its holder (two facts).
* qa3 (three supporting facts): "Where was the OBJECT before the PLACE?"
  (the object's place before it was carried to PLACE: three facts).
* qa4 (two-argument relations): two places east/west/north/south of a
  third; "What is PLACE R of?".
* qa5 (three-argument relations): people hand objects to each other; "Who
  gave the OBJECT to Y?" / "Who received the OBJECT?" / "What did X give
  to Y?".

Each story is a few statements with a question after every few, numbered
from 1 as in bAbI (the question line: ``N question\\tanswer\\tfacts``).
Scores on these files are not BABILong's numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from transformer_xl.data import babilong_sources

PEOPLE = ("Mary", "John", "Daniel", "Sandra")
PLACES = ("bathroom", "hallway", "garden", "office", "bedroom", "kitchen")
OBJECTS = ("football", "apple", "milk")
MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
RELATIONS = {"east": "west", "west": "east", "north": "south", "south": "north"}


def _story_qa1_3(rng: np.random.Generator, task: str, n_questions: int) -> list[str]:
  lines: list[str] = []
  where: dict[str, tuple[str, int]] = {}  # person -> (place, line)
  holds: dict[str, tuple[str, int]] = {}  # object -> (person, line of pick-up)
  trail: dict[str, list[tuple[str, int]]] = {o: [] for o in OBJECTS}  # object's places
  asked = 0
  while asked < n_questions:
    person = PEOPLE[rng.integers(len(PEOPLE))]
    obj = OBJECTS[rng.integers(len(OBJECTS))]
    if task != "qa1" and person in where and rng.random() < 0.3 and obj not in holds:
      lines.append(f"{person} picked up the {obj}.")
      holds[obj] = (person, len(lines))
      trail[obj].append((where[person][0], len(lines)))
    else:
      place = PLACES[rng.integers(len(PLACES))]
      lines.append(f"{person} {MOVES[rng.integers(len(MOVES))]} the {place}.")
      where[person] = (place, len(lines))
      for o, (holder, _) in holds.items():
        if holder == person:
          trail[o].append((place, len(lines)))
    n = len(lines)
    if n % 3:
      continue
    if task == "qa1":
      who = [p for p in PEOPLE if p in where]
      p = who[rng.integers(len(who))]
      lines.append(f"Where is {p}? \t{where[p][0]}\t{where[p][1]}")
    elif task == "qa2":
      held = [o for o in holds]
      if not held:
        continue
      o = held[rng.integers(len(held))]
      holder, picked = holds[o]
      lines.append(f"Where is the {o}? \t{where[holder][0]}\t{picked} {where[holder][1]}")
    else:
      moved = [o for o in OBJECTS if len(trail[o]) >= 2 and trail[o][-1][0] != trail[o][-2][0]]
      if not moved:
        continue
      o = moved[rng.integers(len(moved))]
      (before, b_line), (after, a_line) = trail[o][-2], trail[o][-1]
      lines.append(
          f"Where was the {o} before the {after}? \t{before}\t{holds[o][1]} {a_line} {b_line}"
      )
    asked += 1
  return [f"{i + 1} {line}" for i, line in enumerate(lines)]


def _story_qa4(rng: np.random.Generator) -> list[str]:
  a, b, c = (PLACES[i] for i in rng.permutation(len(PLACES))[:3])
  r = list(RELATIONS)[rng.integers(len(RELATIONS))]
  lines = [f"The {a} is {r} of the {b}.", f"The {c} is {RELATIONS[r]} of the {b}."]
  if rng.random() < 0.5:
    lines.append(f"What is the {b} {RELATIONS[r]} of? \t{a}\t1")
  else:
    lines.append(f"What is {r} of the {b}? \t{a}\t1")
  return [f"{i + 1} {line}" for i, line in enumerate(lines)]


def _story_qa5(rng: np.random.Generator, n_questions: int) -> list[str]:
  lines: list[str] = []
  gave: dict[str, tuple[str, str, int]] = {}  # object -> (giver, receiver, line)
  for _ in range(n_questions):
    for _ in range(2):
      g, r = (PEOPLE[i] for i in rng.permutation(len(PEOPLE))[:2])
      o = OBJECTS[rng.integers(len(OBJECTS))]
      lines.append(f"{g} gave the {o} to {r}.")
      gave[o] = (g, r, len(lines))
    o = list(gave)[rng.integers(len(gave))]
    g, r, at = gave[o]
    kind = rng.integers(3)
    if kind == 0:
      lines.append(f"Who gave the {o} to {r}? \t{g}\t{at}")
    elif kind == 1:
      lines.append(f"Who received the {o}? \t{r}\t{at}")
    else:
      lines.append(f"What did {g} give to {r}? \t{o}\t{at}")
  return [f"{i + 1} {line}" for i, line in enumerate(lines)]


def task_text(task: str, stories: int, seed: int = 0) -> str:
  """A bAbI-format file's text: ``stories`` stories of ``task`` (qa1-qa5)."""
  if task not in ("qa1", "qa2", "qa3", "qa4", "qa5"):
    raise ValueError(f"bAbI-like stories exist for qa1-qa5, not {task!r}.")
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(stories):
    if task == "qa4":
      out += _story_qa4(rng)
    elif task == "qa5":
      out += _story_qa5(rng, int(rng.integers(1, 4)))
    else:
      out += _story_qa1_3(rng, task, int(rng.integers(1, 6)))
  return "\n".join(out) + "\n"


def write_task(folder: str | Path, task: str, train_stories: int, test_stories: int, seed: int = 0):
  """Writes ``qaN_NAME_train.txt`` and ``_test.txt`` into ``folder`` (the
  names ``data.manual_dir`` is searched for); returns their paths."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  name = f"{task}_{babilong_sources.TASK_NAMES[task]}"
  paths = []
  for split, n, s in (("train", train_stories, seed), ("test", test_stories, seed + 1)):
    path = folder / f"{name}_{split}.txt"
    path.write_text(task_text(task, n, s), encoding="utf-8")
    paths.append(path)
  return paths


def train_tokenizer(texts: list[str], vocab_size: int) -> str:
  """A byte-level BPE (GPT-2's kind, with ``<|endoftext|>``) of ``vocab_size``
  tokens trained on ``texts`` with the ``tokenizers`` library, for
  ``data.tokenizer=pretrained:PATH`` where GPT-2's is not at hand (tests,
  CPU studies): its ``tokenizer.json`` text.  Deterministic for the same
  texts."""
  import tokenizers  # pylint: disable=import-outside-toplevel

  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=["<|endoftext|>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tok.train_from_iterator(texts, trainer)
  return tok.to_str(pretty=False) + "\n"
