"""Our lm-eval wrapper (TuneLM) against lm-eval's own Hugging Face model (HFLM) on the same checkpoint.

    .venv/bin/python benchmarks/eval_speed.py                       # CPU, the bundled demo model
    .venv/bin/python benchmarks/eval_speed.py --device cuda --dtype bf16 --repeats 5

Both score the bundled demo_mc task's 160 (question, answer) pairs (log-likelihood) and answer its 40
prompts greedily (generate_until, up to a newline or 16 tokens), at the same batch size, on the demo base
model saved by our checkpointer (the folder HFLM reads). Runs alternate between the two so both share
the machine's drift; the median of ``--repeats`` is reported, wall time beside the process's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from torchtune import config, training
    from torchtune._assets import asset_path
    from torchtune.evaluation._lm import TuneLM
    from torchtune.training import FullModelHFCheckpointer

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    tmp = Path(tempfile.mkdtemp(prefix="eval_speed_"))
    source = FullModelHFCheckpointer(asset_path("demo/base_model"), ["model.safetensors"], output_dir=tmp)
    folder = source.save_checkpoint({"model": source.load_checkpoint()["model"]}, epoch=0)
    cfg = config.load_config("llama2/tiny_eval")
    state = FullModelHFCheckpointer(folder, ["model.safetensors"], output_dir=tmp / "x").load_checkpoint()["model"]
    model = training.build_model(cfg.model, device=torch.device(args.device), dtype=dtype, state_dict=state)
    lms = {
        "TuneLM": TuneLM(model, config.instantiate(cfg.tokenizer), batch_size=args.batch_size),
        "HFLM": HFLM(
            pretrained=str(folder),
            device=args.device,
            batch_size=args.batch_size,
            dtype={"fp32": "float32", "bf16": "bfloat16"}[args.dtype],
        ),
    }
    questions = json.loads(Path(asset_path("demo/eval/demo_eval.json")).read_text())["test"]
    ll = [Instance("loglikelihood", {}, (q["prompt"], c), 0) for q in questions for c in q["choices"]]
    gen_kwargs = {"until": ["\n"], "do_sample": False, "max_gen_toks": 16}
    gen = [Instance("generate_until", {}, (q["prompt"], gen_kwargs), 0) for q in questions]
    work = {
        f"loglikelihood ({len(ll)} requests)": lambda lm: lm.loglikelihood(ll, disable_tqdm=True),
        f"generate_until ({len(gen)} prompts)": lambda lm: lm.generate_until(gen, disable_tqdm=True),
    }

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    times: dict = {(w, name): [] for w in work for name in lms}
    for lm in lms.values():  # warm-up: first-call allocations and kernel selection
        for fn in work.values():
            fn(lm)
    for _ in range(args.repeats):
        for w, fn in work.items():
            for name, lm in lms.items():
                sync()
                wall, cpu = time.perf_counter(), time.process_time()
                fn(lm)
                sync()
                times[(w, name)].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"device {args.device}, dtype {args.dtype}, batch {args.batch_size}, median of {args.repeats} interleaved")
    print(f"{'work':32s} {'model':7s} {'wall s':>8s} {'CPU s':>8s}")
    for (w, name), samples in times.items():
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        print(f"{w:32s} {name:7s} {wall:8.2f} {cpu:8.2f}")


if __name__ == "__main__":
    main()
