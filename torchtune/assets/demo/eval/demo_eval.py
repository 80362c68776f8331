"""The questions of the demo_mc and demo_gen tasks, read from demo_eval.json next to this file.

lm-evaluation-harness calls load() through `custom_dataset: !function demo_eval.load` in the task YAMLs;
the file path is found from this module's own location, so the tasks work wherever torchtune is installed
and never touch the network. demo_eval.json is written by scripts/make_demo_eval_task.py.
"""

import json
from pathlib import Path


def load(**kwargs):
    """A DatasetDict with the "test" questions and the "train" few-shot examples (kwargs are lm-eval's task
    metadata, unused)."""
    import datasets

    data = json.loads((Path(__file__).parent / "demo_eval.json").read_text(encoding="utf-8"))
    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in data.items()})
