"""Make the questions of the bundled lm-evaluation-harness tasks (torchtune/assets/demo/eval/).

Two tasks read the one file ``demo_eval.json`` written here, so the eval runs with no network:

* ``demo_mc`` (multiple choice, acc / acc_norm): the Alpaca prompt of a held-out example and four
  answers: the right one and three wrong answers of the same kind (the answers of other held-out
  examples of that task), in a seeded order.
* ``demo_gen`` (greedy generation, exact_match): the same prompts; the answer is generated up to the
  first newline and compared with the expected one.

Five held-out examples of each of the demo's eight tasks make the 40 questions (``test`` split); one
training example of each task makes the ``train`` split that few-shot prompts are drawn from.
Seeded; writes the same bytes on every machine (``tests/test_demo_assets.py`` regenerates and compares).

Usage::

    python scripts/make_demo_eval_task.py                 # writes torchtune/assets/demo/eval/demo_eval.json
    python scripts/make_demo_eval_task.py --out /tmp/demo_eval.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchtune.datasets import AlpacaInstructTemplate  # noqa: E402

BUNDLE = REPO / "torchtune" / "assets" / "demo"
DEFAULT_OUT = BUNDLE / "eval" / "demo_eval.json"
SEED = 1234
PER_TASK = 5
NUM_CHOICES = 4

# The instruction prefix of each task of scripts/make_demo_data.py.
TASK_PREFIXES = {
    "add": "What is ",
    "subtract": "Subtract ",
    "reverse": "Reverse ",
    "spell": "Spell ",
    "upper": "Write the word in capital",
    "count": "How many letters",
    "sort_digits": "Sort the numbers",
    "sort_letters": "Sort the letters",
}


def task_of(row: dict) -> str:
    return next(name for name, prefix in TASK_PREFIXES.items() if row["instruction"].startswith(prefix))


def make_questions(heldout: list[dict], train: list[dict], seed: int = SEED) -> dict[str, list[dict]]:
    """``{"test": [...], "train": [...]}``; each question is ``{task, prompt, output, choices, label}``."""
    rng = random.Random(seed)
    template = AlpacaInstructTemplate()
    by_task: dict[str, list[dict]] = {name: [] for name in TASK_PREFIXES}
    for row in heldout:
        by_task[task_of(row)].append(row)

    def question(row: dict, pool: list[dict]) -> dict:
        wrong = sorted({r["output"] for r in pool} - {row["output"]})
        if len(wrong) < NUM_CHOICES - 1:  # "count" has few distinct answers: add the neighbouring numbers
            near = [str(int(row["output"]) + d) for d in (1, -1, 2, -2, 3)]
            wrong += [n for n in near if n not in wrong and n != row["output"] and int(n) >= 0]
        choices = rng.sample(wrong, NUM_CHOICES - 1) + [row["output"]]
        rng.shuffle(choices)
        return {
            "task": task_of(row),
            "prompt": template.format(row),
            "output": row["output"],
            "choices": choices,
            "label": choices.index(row["output"]),
        }

    test = [question(row, rows) for name, rows in by_task.items() for row in rows[:PER_TASK]]
    firsts = {}
    for row in train:
        firsts.setdefault(task_of(row), row)
    shots = [question(firsts[name], by_task[name]) for name in TASK_PREFIXES]
    return {"test": test, "train": shots}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    args = parser.parse_args(argv)
    heldout = json.loads((BUNDLE / "heldout.json").read_text())
    train = json.loads((BUNDLE / "train.json").read_text())
    questions = make_questions(heldout, train)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(questions, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(questions['test'])} questions, {len(questions['train'])} few-shot examples")


if __name__ == "__main__":
    main()
