"""Run torchtune 0.6.1's own unit tests for the scope this library shares with it, against an installed
``torchtune`` (ours, or PyTorch's for the baseline), and print the results by area.

The tests are not fetched here: give the path of torchtune's ``tests`` folder from its v0.6.1 tag (a git
archive or checkout of PyTorch's torchtune repository). They run as shipped, in a scratch copy, with one
change: ``tests/common.py``'s ``TUNE_PATH`` points at the ``_cli/tune.py`` of the ``torchtune`` that the
given Python imports (torchtune's CLI tests run that file as a script).

    python scripts/torchtune_compat.py /path/to/torchtune-0.6.1/tests                 # ours (this venv)
    python scripts/torchtune_compat.py /path/to/tests --python /venv/tt061/bin/python  # torchtune itself
    python scripts/torchtune_compat.py /path/to/tests --baseline tt061.json --json ours.json

Their conftest and tests need the pytest plugins torchtune's dev extras install (pytest-integration,
pytest-mock, expecttest); the script names what is missing in the Python that runs them.
``--json`` writes every test's outcome; ``--baseline`` reads such a file from a torchtune run and adds the
share of torchtune's passes that pass here, and the tests that pass there and fail here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

# The files of torchtune 0.6.1's tests/torchtune/ in scope: full finetuning of the families this library
# ships. Left out: LoRA/DoRA/QLoRA (peft, lora_*), multimodal (clip, flamingo, llama3_2_vision, t5, flux,
# vision transforms, multimodal datasets), RLHF and preference data (rlhf/, preference, hh_rlhf, stack_exchange,
# the Mistral classifier), knowledge distillation (kd_losses), LayerSkip (early_exit_loss, layer_dropout),
# export, fusion, NF4, distributed checkpointing of adapters, and generation.
AREAS: Dict[str, List[str]] = {
    "_cli": [f"_cli/test_{n}.py" for n in ("cat", "cp", "download", "ls", "run", "tune", "validate")],
    "config": [f"config/test_{n}.py" for n in ("config_utils", "instantiate", "parse", "validate")],
    "data": [f"data/test_{n}.py" for n in ("collate", "data_utils", "messages", "prompt_templates")],
    "datasets": [
        f"datasets/test_{n}_dataset.py"
        for n in (
            "alpaca",
            "chat",
            "cnn_dailymail",
            "concat",
            "grammar",
            "instruct",
            "packed",
            "samsum",
            "sft",
            "slimorca",
            "text_completion",
            "wikitext",
        )
    ],
    "models": [
        "models/gemma/test_gemma_tokenizer.py",
        "models/llama2/test_llama2_prompt_template.py",
        "models/llama2/test_llama2_tokenizer.py",
        "models/llama3/test_llama3.py",
        "models/llama3/test_llama3_tokenizer.py",
        "models/llama3_1/test_position_embeddings.py",
        "models/mistral/test_mistral.py",
        "models/mistral/test_mistral_prompt_template.py",
        "models/mistral/test_mistral_tokenizer.py",
        "models/phi3/test_phi3.py",
        "models/phi3/test_phi3_position_embeddings.py",
        "models/phi3/test_phi3_tokenizer.py",
        "models/phi4/test_phi4_tokenizer.py",
        "models/qwen2/test_qwen2.py",
        "models/qwen2/test_qwen2_tokenizer.py",
        "models/qwen2_5/test_tokenizer.py",
    ],
    "modules": [
        f"modules/test_{n}.py"
        for n in (
            "attention",
            "attention_utils",
            "common_utils",
            "cosine_with_warmup",
            "feed_forward",
            "kv_cache",
            "layernorm",
            "position_embeddings",
            "rms_norm",
            "transformer_decoder",
        )
    ],
    "modules/loss": ["modules/loss/test_ce_chunked_output_loss.py"],
    "tokenizers": [
        "modules/tokenizers/test_gpt2.py",
        "modules/transforms/tokenizers/test_hf_tokenizer.py",
        "modules/transforms/tokenizers/test_sentencepiece.py",
        "modules/transforms/tokenizers/test_tiktoken.py",
        "modules/transforms/tokenizers/test_utils.py",
    ],
    "training/checkpointing": [
        "training/checkpointing/test_checkpointer.py",
        "training/checkpointing/test_checkpointer_utils.py",
    ],
    "training": [f"training/test_{n}.py" for n in ("precision", "seed", "memory", "metric_logging")],
    "utils": ["utils/test_device.py", "utils/test_logging.py"],
}
_PLUGINS = {"pytest_integration": "pytest-integration", "pytest_mock": "pytest-mock", "expecttest": "expecttest"}


def _run(python: str, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | _pythonpath()
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def _pythonpath() -> Dict[str, str]:
    # PYTHONPATH given by the caller (a worktree of this repository) is kept: it selects which torchtune runs.
    value = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": value} if value else {}


def _prepare(tests: Path, scratch: Path, python: str) -> Path:
    """A copy of torchtune's tests under ``scratch/tests`` whose TUNE_PATH names the installed CLI file."""
    if not (tests / "common.py").is_file() or not (tests / "torchtune").is_dir():
        raise SystemExit(f"{tests} is not torchtune's tests folder (no common.py and torchtune/ in it).")
    target = scratch / "tests"
    shutil.copytree(tests, target, ignore=shutil.ignore_patterns("__pycache__"))
    tune_py = _run(python, "import torchtune._cli.tune as t; print(t.__file__)", scratch).strip()
    common = target / "common.py"
    text = common.read_text()
    if 'TUNE_PATH = "torchtune/_cli/tune.py"' not in text:
        raise SystemExit(f"{tests}/common.py has no TUNE_PATH line as torchtune 0.6.1 ships it.")
    common.write_text(text.replace('TUNE_PATH = "torchtune/_cli/tune.py"', f"TUNE_PATH = {tune_py!r}"))
    return target


def _check_plugins(python: str, cwd: Path) -> None:
    code = (
        "import importlib.util as u; print(' '.join(n for n in " + repr(list(_PLUGINS)) + " if u.find_spec(n) is None))"
    )
    missing = _run(python, code, cwd).split()
    if missing:
        names = " ".join(_PLUGINS[m] for m in missing)
        raise SystemExit(f"torchtune's tests need {names} in {python}: `{python} -m pip install {names}`.")


def _outcomes(junit: Path, root: Path) -> Dict[str, str]:
    """{test id: passed | failed | error | skipped} from pytest's JUnit XML."""
    result: Dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        # a test erroring in teardown after passing is reported twice: the worse outcome stands
        if result.get(name) in ("failed", "error"):
            continue
        result[name] = outcome
    return result


def _area_of(test_id: str) -> str:
    # JUnit names a test by its module's dotted path, then its class if it has one
    path = test_id.split("::")[0].replace(".", "/") + "/"
    for area, files in AREAS.items():
        if any(f"tests/torchtune/{f[: -len('.py')]}/" in path for f in files):
            return area
    return "?"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("tests", type=Path, help="torchtune 0.6.1's tests/ folder")
    parser.add_argument("--python", default=sys.executable, help="the Python whose torchtune is tested")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--baseline", type=Path, help="a --json file of a run against torchtune 0.6.1")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds for the whole run")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="torchtune-compat-") as tmp:
        scratch = Path(tmp)
        _check_plugins(args.python, scratch)
        tests = _prepare(args.tests.resolve(), scratch, args.python)
        files = [f"tests/torchtune/{f}" for fs in AREAS.values() for f in fs]
        missing = [f for f in files if not (scratch / f).is_file()]
        if missing:
            raise SystemExit(f"{args.tests} lacks {', '.join(missing)}: is it torchtune 0.6.1's tests folder?")
        junit = scratch / "junit.xml"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | _pythonpath()
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
        cmd += [f"--junitxml={junit}", *files]
        subprocess.run(cmd, cwd=scratch, env=env, timeout=args.timeout, stdout=subprocess.DEVNULL)
        outcomes = _outcomes(junit, tests)

    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    table = defaultdict(lambda: defaultdict(int))
    for test_id, outcome in outcomes.items():
        table[_area_of(test_id)][outcome] += 1
    if baseline is not None:
        # every test torchtune passes counts, also one that was not even collected here (its file failed to import)
        for test_id, there in baseline.items():
            if there == "passed":
                area = _area_of(test_id)
                table[area]["baseline_passed"] += 1
                table[area]["both_passed"] += outcomes.get(test_id) == "passed"
    header = "| area | tests | passed | failed | errors | skipped |" + (
        " torchtune passes | of those, pass here |" if baseline else ""
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    totals = defaultdict(int)
    for area in [*AREAS, "?"]:
        row = table.get(area)
        if not row:
            continue
        n = sum(row[k] for k in ("passed", "failed", "error", "skipped"))
        for k in ("passed", "failed", "error", "skipped", "baseline_passed", "both_passed"):
            totals[k] += row[k]
        totals["n"] += n
        line = f"| {area} | {n} | {row['passed']} | {row['failed']} | {row['error']} | {row['skipped']} |"
        if baseline is not None:
            line += f" {row['baseline_passed']} | {row['both_passed']} |"
        print(line)
    line = (
        f"| **all** | {totals['n']} | {totals['passed']} | {totals['failed']} | {totals['error']} | "
        f"{totals['skipped']} |"
    )
    if baseline is not None:
        share = totals["both_passed"] / totals["baseline_passed"] if totals["baseline_passed"] else 0.0
        line += f" {totals['baseline_passed']} | {totals['both_passed']} ({share:.0%}) |"
    print(line)
    if baseline is not None:
        lost = sorted(t for t, o in baseline.items() if o == "passed" and outcomes.get(t) != "passed")
        if lost:
            print(f"\nPassing with torchtune 0.6.1, not here ({len(lost)}):")
            for test_id in lost:
                print(f"  {outcomes.get(test_id, 'absent'):7} {test_id}")
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
