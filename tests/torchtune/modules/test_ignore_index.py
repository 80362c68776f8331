"""One ignore label (-100), defined by the losses and used by datasets, collate, evaluation and recipes."""

import ast
import inspect
from pathlib import Path

import torch
import torch.nn.functional as F

import torchtune
from torchtune import datasets
from torchtune.modules import loss
from torchtune.modules.loss import _ignore_index

REPO = Path(torchtune.__file__).resolve().parent.parent


def test_the_constant_is_shared_and_is_what_the_losses_ignore():
    torch_default = inspect.signature(F.cross_entropy).parameters["ignore_index"].default
    assert loss.CROSS_ENTROPY_IGNORE_IDX == -100 == torch_default
    assert datasets.CROSS_ENTROPY_IGNORE_IDX is loss.CROSS_ENTROPY_IGNORE_IDX  # kept for compatibility
    assert loss.CrossEntropyLoss().ignore_index == loss.CROSS_ENTROPY_IGNORE_IDX
    assert loss.ChunkedCrossEntropyLoss().ignore_index == loss.CROSS_ENTROPY_IGNORE_IDX
    batch = datasets.padded_collate([{"tokens": [1, 2, 3], "labels": [1, 2, 3]}, {"tokens": [4], "labels": [4]}])
    assert batch["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]


def test_a_padded_label_adds_nothing_to_either_loss():
    torch.manual_seed(0)
    proj, hidden = torch.nn.Linear(8, 11), torch.randn(1, 4, 8)
    labels = torch.tensor([[3, 5, 7, 2]])
    padded = torch.tensor([[3, 5, 7, 2, loss.CROSS_ENTROPY_IGNORE_IDX]])
    hidden_padded = torch.cat([hidden, torch.randn(1, 1, 8)], dim=1)
    for fn in (loss.CrossEntropyLoss(), loss.ChunkedCrossEntropyLoss(num_output_chunks=2, min_chunk_rows=1)):
        torch.testing.assert_close(fn(proj, hidden_padded, padded), fn(proj, hidden, labels))


def _minus_100_literals(path: Path) -> list:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and node.operand.value == 100
    ]


def test_no_other_module_spells_minus_100():
    found = {}
    for folder in ("torchtune", "recipes"):
        for path in sorted((REPO / folder).rglob("*.py")):
            lines = _minus_100_literals(path)
            if lines and path != Path(_ignore_index.__file__).resolve():  # its one definition
                found[str(path.relative_to(REPO))] = lines
    assert found == {}, f"import CROSS_ENTROPY_IGNORE_IDX from torchtune.modules.loss instead of -100: {found}"
    assert loss.CROSS_ENTROPY_IGNORE_IDX is _ignore_index.CROSS_ENTROPY_IGNORE_IDX
