"""Peak host memory of ``tune export`` of a distributed ``step_N``, against the size of the model.

    .venv/bin/python benchmarks/bench_export.py     # 0.54B parameters in fp32 (2.2 GB): docs/distributed.md
    .venv/bin/python benchmarks/bench_export.py --num-layers 1 --embed-dim 256 --vocab-size 1000

Writes a step folder as ``full_finetune_distributed`` does -- random fp32 weights of a Llama2-architecture
model saved with torch.distributed.checkpoint under ``model.``, ``recipe_state.pt`` and ``manifest.json``;
no optimizer state, which the export never reads (it only hashes its files, in 1 MB reads) -- and a base
folder with ``config.json`` only. Then runs the real ``tune export`` on it in a child process, and, in another child,
only the imports the export needs. Reported: the model's bytes, its largest tensor, each child's peak
RSS (``ru_maxrss``), and the export's peak above the imports': the host memory the weights cost.
The folders are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from torchtune.models._hf_family import llama_like_config, shape_of_model  # noqa: E402
from torchtune.models.llama2 import llama2  # noqa: E402
from torchtune.utils._checkpointing._manifest import MANIFEST_NAME, build_manifest  # noqa: E402

DEFAULT_MODEL = dict(vocab_size=32000, num_layers=8, num_heads=16, embed_dim=2048, intermediate_dim=5632)
IMPORTS = (
    "import torch.distributed.checkpoint, safetensors, huggingface_hub; "
    "import torchtune.training.checkpointing._hf_export; from torchtune._cli.tune import main"
)


def write_step_folder(root: Path, model_args: Dict[str, int]) -> Dict[str, Any]:
    """``root/base`` (config.json) and ``root/out/step_1`` (sharded state as the distributed recipe saves it)."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    with torch.device("meta"):
        model = llama2(num_kv_heads=model_args["num_heads"], max_seq_len=4096, **model_args)
    base = root / "base"
    base.mkdir(parents=True)
    config = llama_like_config(shape_of_model(model), hf_model_type="llama", architecture="LlamaForCausalLM")
    (base / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    state: Dict[str, Any] = {"model": {name: torch.randn(p.shape) * 0.02 for name, p in model.named_parameters()}}
    sizes = [t.numel() * t.element_size() for t in state["model"].values()]
    step = root / "out" / "step_1"
    dcp.save(state, checkpoint_id=str(step / "sharded_state"), no_dist=True)
    del state
    torch.save({"global_step": 1}, step / "recipe_state.pt")
    (step / MANIFEST_NAME).write_text(json.dumps(build_manifest(step, step=1, epoch=0, intermediate=True)))
    return {"model_bytes": sum(sizes), "largest_tensor_bytes": max(sizes), "parameters": sum(sizes) // 4}


def child_peak_rss(argv: List[str]) -> tuple[int, float]:
    """Peak RSS (bytes) of a child process running ``argv`` and its wall time; raises if it fails.

    ``RUSAGE_CHILDREN`` keeps the largest peak of any child waited for so far, so each measurement
    runs in a fresh intermediate process of its own."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.perf_counter() - t)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    rss, seconds = result.stdout.split()
    return int(rss), float(seconds)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, value in DEFAULT_MODEL.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    model_args = {k: getattr(args, k) for k in DEFAULT_MODEL}
    root = Path(tempfile.mkdtemp(prefix="bench_export_", dir=args.dir))
    try:
        sizes = write_step_folder(root, model_args)
        imports_rss, _ = child_peak_rss([sys.executable, "-c", IMPORTS])
        tune = [sys.executable, "-m", "torchtune._cli.tune", "export", str(root / "out" / "step_1")]
        export_rss, seconds = child_peak_rss(
            [*tune, "--output-dir", str(root / "hf"), "--base-model-dir", str(root / "base")]
        )
        exported = sum(p.stat().st_size for p in (root / "hf").glob("*.safetensors"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "model": model_args,
        **sizes,
        "exported_bytes": exported,
        "imports_peak_rss_bytes": imports_rss,
        "export_peak_rss_bytes": export_rss,
        "export_above_imports_bytes": export_rss - imports_rss,
        "export_seconds": round(seconds, 1),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average": os.getloadavg()[0],
    }
    gb = 1e9
    print(
        f"| model (fp32) | largest tensor | export peak RSS | imports only | export above imports | wall s |\n"
        f"|---|---|---|---|---|---|\n"
        f"| {sizes['model_bytes'] / gb:.2f} GB ({sizes['parameters'] / 1e9:.2f}B parameters) "
        f"| {sizes['largest_tensor_bytes'] / gb:.3f} GB | {export_rss / gb:.2f} GB | {imports_rss / gb:.2f} GB "
        f"| {(export_rss - imports_rss) / gb:.2f} GB | {seconds:.1f} |"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
