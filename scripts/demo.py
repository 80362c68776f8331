"""`make demo`: a real full finetune, end to end, offline, on CPU.

1. Measures the bundled base model (torchtune/assets/demo/base_model) on the held-out split:
   loss and exact-match accuracy of greedy answers.
2. Runs `tune run full_finetune_single_device --config llama2/tiny_full` (optimizer in backward,
   bitsandbytes AdamW8bit), stops it with SIGINT partway, and resumes it with the command the
   recipe prints.
3. Measures the finetuned model the same way, prints a few generations next to the expected
   answers, and draws the loss curve.
4. Scores the base and the finetuned model with EleutherAI's lm-evaluation-harness on the bundled
   offline tasks (`tune run eleuther_eval --config llama2/tiny_eval`): demo_mc (multiple choice,
   acc / acc_norm) and demo_gen (greedy answers, exact_match), and prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from torchtune import config, training  # noqa: E402
from torchtune.datasets import AlpacaInstructTemplate, padded_collate  # noqa: E402
from torchtune.generation import evaluate_exact_match, heldout_loss  # noqa: E402
from torchtune.training.metric_logging import read_metrics  # noqa: E402

CONFIG = "llama2/tiny_full"
EVAL_CONFIG = "llama2/tiny_eval"
BUNDLE = REPO / "torchtune" / "assets" / "demo"
TUNE = str(Path(sys.executable).parent / "tune")


def load_model(cfg, checkpoint_dir: Path) -> torch.nn.Module:
    """The config's model with the weights of ``checkpoint_dir`` (any folder the recipe wrote)."""
    ckpt_cfg = cfg.checkpointer.copy()
    ckpt_cfg.checkpoint_dir = str(checkpoint_dir)
    ckpt_cfg.output_dir = str(REPO / "demo_out" / "_unused")
    checkpointer = config.instantiate(ckpt_cfg)
    weights = checkpointer.load_checkpoint()["model"]
    return training.build_model(cfg.model, device=torch.device("cpu"), dtype=torch.float32, state_dict=weights).eval()


def evaluate(cfg, checkpoint_dir: Path, heldout_rows: list, n_exact: int) -> tuple[float, float, list]:
    tokenizer = config.instantiate(cfg.tokenizer)
    model = load_model(cfg, checkpoint_dir)
    dataset = config.instantiate(cfg.dataset, tokenizer, data_files=str(BUNDLE / "heldout.json"))
    loss = heldout_loss(model, dataset, lambda b: padded_collate(b, padding_idx=0))
    accuracy, results = evaluate_exact_match(model, tokenizer, heldout_rows[:n_exact], AlpacaInstructTemplate())
    return loss, accuracy, results


def run_streaming(cmd: list[str], stop_at_step: int | None, metrics: Path) -> tuple[int, str]:
    """Run ``cmd``, echoing its stderr; send SIGINT once ``metrics`` shows ``stop_at_step``."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=sys.stdout)
    captured: list[bytes] = []

    def pump() -> None:
        while chunk := proc.stderr.read1(4096):
            captured.append(chunk)
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    sent = False
    while proc.poll() is None:
        time.sleep(0.2)
        if stop_at_step is not None and not sent and metrics.exists():
            steps = [row["step"] for row in read_metrics(metrics)]
            if steps and steps[-1] >= stop_at_step:
                proc.send_signal(signal.SIGINT)
                sent = True
    reader.join()
    return proc.returncode, b"".join(captured).decode(errors="replace")


def lm_eval_scores(checkpoint_dir: Path, results_file: Path) -> dict:
    """``tune run eleuther_eval`` on ``checkpoint_dir``: the content of its results file."""
    cmd = [
        TUNE,
        "run",
        "eleuther_eval",
        "--config",
        EVAL_CONFIG,
        f"checkpointer.checkpoint_dir={checkpoint_dir}",
        f"results_file={results_file}",
    ]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"The eval of {checkpoint_dir} failed (exit status {done.returncode}).")
    print(done.stdout, flush=True)
    return json.loads(results_file.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default=str(REPO / "demo_out"))
    parser.add_argument("--stop-at-step", type=int, default=60, help="interrupt the run after this step")
    parser.add_argument("--exact-match-examples", type=int, default=100)
    parser.add_argument("overrides", nargs="*", help="key=value overrides for the demo config")
    args = parser.parse_args()
    torch.manual_seed(0)
    out = Path(args.output_dir)
    shutil.rmtree(out, ignore_errors=True)
    overrides = [f"output_dir={out}", *args.overrides]
    cfg = config.load_config(CONFIG, overrides)
    heldout_rows = json.loads((BUNDLE / "heldout.json").read_text())

    started = time.perf_counter()
    print("== 1/4 Base model on the held-out split", flush=True)
    base_loss, base_acc, _ = evaluate(cfg, BUNDLE / "base_model", heldout_rows, args.exact_match_examples)
    print(f"   held-out loss {base_loss:.3f}, exact match {base_acc:.1%}", flush=True)

    print(f"== 2/4 Finetune ({CONFIG}), interrupted at step {args.stop_at_step} and resumed", flush=True)
    metrics = out / "logs" / "metrics.jsonl"
    cmd = [TUNE, "run", "full_finetune_single_device", "--config", CONFIG, *overrides]
    code, stderr = run_streaming(cmd, args.stop_at_step, metrics)
    match = re.search(r"Resume with:\s*\n\s*(tune run .+)", stderr)
    if code != 0 and match is None:
        print(f"The finetune failed (exit status {code}); see the messages above.", file=sys.stderr)
        return 1
    if match is not None:
        resume = shlex.split(match.group(1))
        code, _ = run_streaming([TUNE, *resume[1:]], None, metrics)
        if code != 0:
            print(f"The resumed finetune failed (exit status {code}).", file=sys.stderr)
            return 1
    final = max(out.glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))

    print("== 3/4 Finetuned model on the held-out split", flush=True)
    loss, acc, results = evaluate(cfg, final, heldout_rows, args.exact_match_examples)
    png = out / "loss_curve.png"
    from torchtune.utils.plotting import plot_metrics

    plot_metrics(metrics, png)

    print("== 4/4 lm-evaluation-harness on the bundled tasks (demo_mc, demo_gen): base, then finetuned", flush=True)
    base_scores = lm_eval_scores(BUNDLE / "base_model", out / "eval_base_model.json")
    tuned_scores = lm_eval_scores(final, final / "eval_results.json")

    print("\nGreedy generations (held-out):")
    for prompt, want, got in results[:6]:
        question = (
            prompt.split("### Instruction:\n")[-1].split("\n\n### Response")[0].replace("\n\n### Input:\n", " | ")
        )
        print(f"  {question[:60]:60s} expected {want!r:14s} got {got.strip()!r}")
    print("\nResults")
    print(f"  held-out loss        {base_loss:.3f} -> {loss:.3f}")
    print(f"  exact-match accuracy {base_acc:.1%} -> {acc:.1%}  ({args.exact_match_examples} held-out examples)")
    from torchtune.evaluation import score_changes

    for line in score_changes(base_scores, tuned_scores):
        print(f"  {line}")
    print(f"  finetuned checkpoint {final}")
    print(f"  loss curve           {png}")
    print(f"  total time           {time.perf_counter() - started:.0f} s")
    ok = loss < base_loss and acc > base_acc
    if not ok:
        print("The finetune did not improve the held-out metrics.", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
