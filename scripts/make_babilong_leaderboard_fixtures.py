r"""Writes tests/fixtures/babilong/leaderboard_rule.json by running the
BABILong leaderboard's scoring.

    python scripts/make_babilong_leaderboard_fixtures.py CHECKOUT

CHECKOUT holds ``babilong/metrics.py`` of booydar/babilong (Apache-2.0;
``git --git-dir=MIRROR archive HEAD babilong | tar -x``): its
``compare_answers(target, output, question, task_labels)`` with its
``TASK_LABELS`` is what ``babilong/collect_results.py`` scores the
leaderboard's CSV files with.  The module imports nothing, so it is loaded
from its file alone.  Written: ``{"source", "cases": [{task, target, output,
question, right}]}``, outputs chosen to reach every branch (a label in the
question, two labels, qa8's several objects, qa19's directions, text after
the first ".", ``<context>``, "Question", case).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "babilong"

CASES = [  # (task, target, output, question)
    ("qa1", "hallway", "The most recent location of John is hallway.", "Where is John? "),
    ("qa1", "hallway", "hallway", "Where is John?"),
    ("qa1", "Hallway", "HALLWAY is where", "Where is John?"),
    ("qa1", "hallway", "John is in the hallway or the kitchen.", "Where is John?"),
    ("qa1", "hallway", "John is in the hallway. Before that, the kitchen.", "Where is John?"),
    ("qa1", "hallway", "hallway <context> kitchen", "Where is John?"),
    ("qa1", "hallway", "hallway Question: kitchen", "Where is John?"),
    ("qa1", "hallway", "nowhere", "Where is John?"),
    ("qa1", "hallway", "", "Where is John?"),
    (
        "qa3",
        "office",
        "It was in the office, then the kitchen",
        "Where was the milk before the kitchen?",
    ),
    ("qa3", "office", "the kitchen", "Where was the milk before the kitchen?"),
    ("qa4", "garden", "The garden is west of the hallway", "What is the hallway east of?"),
    ("qa5", "Fred", "Fred gave it to Mary", "Who gave the football to Mary?"),
    ("qa5", "Fred", "Fred gave the football to Jeff", "Who gave the football to Mary?"),
    ("qa5", "milk", "the milk", "What did Bill give to Fred?"),
    ("qa6", "yes", "yes", "Is John in the kitchen?"),
    ("qa6", "no", "no, not yes", "Is John in the kitchen?"),
    ("qa7", "two", "two", "How many objects is Mary carrying?"),
    ("qa8", "apple,football", "football and apple", "What is Mary carrying?"),
    ("qa8", "apple,football", "apple", "What is Mary carrying?"),
    ("qa8", "apple,football", "apple, football and milk", "What is Mary carrying?"),
    ("qa8", "nothing", "nothing", "What is Mary carrying?"),
    ("qa19", "n,w", "n,w", "How do you go from the garden to the office?"),
    ("qa19", "n,w", "s,e", "How do you go from the garden to the office?"),
    ("qa20", "kitchen", "the kitchen, hungry", "Where will Sumit go?"),
]


def main(checkout: str) -> None:
  spec = importlib.util.spec_from_file_location(
      "babilong_metrics", Path(checkout) / "babilong" / "metrics.py"
  )
  metrics = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(metrics)
  cases = [
      {
          "task": task,
          "target": target,
          "output": output,
          "question": question,
          "right": bool(
              metrics.compare_answers(target, output, question, metrics.TASK_LABELS[task])
          ),
      }
      for task, target, output, question in CASES
  ]
  out = {
      "source": "booydar/babilong babilong/metrics.py compare_answers",
      "task_labels": metrics.TASK_LABELS,
      "cases": cases,
  }
  (OUT / "leaderboard_rule.json").write_text(json.dumps(out, indent=1) + "\n")
  print(
      f"{sum(c['right'] for c in cases)} of {len(cases)} right; wrote {OUT / 'leaderboard_rule.json'}"
  )


if __name__ == "__main__":
  main(sys.argv[1])
