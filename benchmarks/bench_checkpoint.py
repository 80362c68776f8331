"""Time a step checkpoint's save and load against a plain ``save_file`` + ``torch.save``, interleaved.

    .venv/bin/python benchmarks/bench_checkpoint.py                 # 1B parameters, 3 repeats: docs/checkpoints.md
    .venv/bin/python benchmarks/bench_checkpoint.py --num-layers 1 --embed-dim 256 --vocab-size 1000 --repeats 1

The checkpoint is what the recipe writes at a step: random bf16 weights of a Llama2-architecture
model (default ~1.06B parameters: 18 layers, dim 2048, vocab 32000) and a torch AdamW state of the
same shapes (``exp_avg``, ``exp_avg_sq``: bf16 like the weights, so 3x the weights on disk).

- ``ours``: ``FullModelHFCheckpointer.save_checkpoint`` (each tensor to the host and into HF layout,
  streamed into ``model.safetensors``, ``recipe_state.pt`` through ``torch.save``, checksums
  while writing, fsync of every file, manifest, atomic rename). Load: the checkpointer's load (size checks,
  sums in a background thread) into the model, ``recipe_state.pt`` memory-mapped into a fresh
  optimizer one parameter at a time (``torchtune.training.load_optimizer_state``).
- ``plain``: ``safetensors.torch.save_file`` of the model's state dict and ``torch.save`` of the
  optimizer's state dict, nothing else (no fsync, no checksum). Load: ``load_file`` into the model,
  ``torch.load`` into a fresh optimizer's ``load_state_dict``. ``plain+fsync`` adds the fsync of
  those two files, the durability ours has.

Both loads end with the weights in the model and the state in the optimizer, spot-checked against
what was saved (every tensor). Before every timed operation ``os.sync()`` flushes what the previous one left
dirty, and the order of the variants alternates between repeats. Wall and process CPU time (all
threads) are reported, medians over the repeats, with the ratios ours / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from torchtune import training  # noqa: E402
from torchtune.models.llama2 import llama2, tune_to_hf  # noqa: E402
from torchtune.training import FullModelHFCheckpointer  # noqa: E402
from torchtune.utils._checkpointing import load_recipe_state  # noqa: E402
from torchtune.utils._checkpointing._atomic import fsync_file  # noqa: E402
from torchtune.utils._checkpointing._manifest import check_checksums, verify_checkpoint_files  # noqa: E402

DEFAULT_MODEL = dict(vocab_size=32000, num_layers=18, num_heads=16, embed_dim=2048, intermediate_dim=5632)


def build_model(vocab_size: int, num_layers: int, num_heads: int, embed_dim: int, intermediate_dim: int) -> Any:
    with torch.device("meta"):
        model = llama2(
            vocab_size=vocab_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_heads,
            embed_dim=embed_dim,
            max_seq_len=2048,
            intermediate_dim=intermediate_dim,
        )
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return model


def fill_adamw_state(optimizer: torch.optim.Optimizer, seed: int = 1) -> None:
    """The state AdamW has after some steps, without running them (a 1B step on CPU takes minutes)."""
    gen = torch.Generator().manual_seed(seed)
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p] = {
                "step": torch.tensor(100.0),
                "exp_avg": torch.empty_like(p).normal_(0.0, 1e-3, generator=gen),
                "exp_avg_sq": torch.empty_like(p).uniform_(0.0, 1e-6, generator=gen),
            }


def fingerprint(model: Any, optimizer: torch.optim.Optimizer) -> List[float]:
    """Every weight and state tensor, spot-checked: its first and last element and the float64 sum of
    every 997th (a full comparison of 3B elements would take longer than the load; the tests compare
    saved and loaded tensors bit for bit)."""

    def spot(t: torch.Tensor) -> List[float]:
        flat = t.detach().reshape(-1)
        return [float(flat[0]), float(flat[-1]), float(flat[::997].double().sum())]

    sums: List[float] = []
    for p in model.parameters():
        state = optimizer.state[p]
        sums += spot(p) + spot(state["exp_avg"]) + spot(state["exp_avg_sq"]) + [float(state["step"])]
    return sums


def write_base_folder(model: Any, folder: Path, num_heads: int) -> None:
    """The input folder a run starts from (config.json + model.safetensors), written once, untimed."""
    folder.mkdir(parents=True)
    dim = model.tok_embeddings.embedding_dim
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": model.layers[0].mlp.w1.out_features,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "num_hidden_layers": len(model.layers),
        "max_position_embeddings": 2048,
        "vocab_size": model.tok_embeddings.num_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(
        tune_to_hf(model.state_dict(), num_heads=num_heads, num_kv_heads=num_heads, dim=dim),
        folder / "model.safetensors",
    )


def timed(fn: Callable[[], Any], sync_first: bool = True) -> Dict[str, float]:
    if sync_first:
        os.sync()  # what an earlier operation left dirty is not this one's to write back
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint-", dir=args.dir))
    try:
        return _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> Dict[str, Any]:
    model = build_model(args.vocab_size, args.num_layers, args.num_heads, args.embed_dim, args.intermediate_dim)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    fill_adamw_state(optimizer)
    reference = fingerprint(model, optimizer)
    write_base_folder(model, work / "base", args.num_heads)
    saver = FullModelHFCheckpointer(work / "base", ["model.safetensors"], output_dir=work / "out")
    plain = work / "plain"
    plain.mkdir()
    step = {"n": 0}

    def save_ours() -> None:
        step["n"] += 1
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "global_step": step["n"]}
        saver.save_checkpoint(state, epoch=0, step=step["n"], intermediate=True)

    def save_plain() -> None:
        save_file(model.state_dict(), plain / "model.safetensors")
        torch.save({"optimizer": optimizer.state_dict()}, plain / "optimizer.pt")

    def fsync_plain() -> None:
        fsync_file(plain / "model.safetensors")
        fsync_file(plain / "optimizer.pt")

    jobs: List[Any] = []

    def load_ours() -> None:
        folder = work / "out" / f"step_{step['n']}"
        loader = FullModelHFCheckpointer(
            folder, ["model.safetensors"], output_dir=work / "out2", verify_checksums=args.verify_checksums
        )
        model.load_state_dict(loader.load_checkpoint()["model"])
        state_files = [training.RECIPE_STATE_NAME]
        jobs[:] = [loader.checksums, verify_checkpoint_files(folder, state_files, args.verify_checksums)]
        state = load_recipe_state(folder / training.RECIPE_STATE_NAME)
        training.load_optimizer_state(optimizer, state["optimizer"])

    def load_plain() -> None:
        model.load_state_dict(load_file(plain / "model.safetensors"))
        optimizer.load_state_dict(torch.load(plain / "optimizer.pt", weights_only=True)["optimizer"])

    results: Dict[str, List[Dict[str, float]]] = {
        k: [] for k in ("save ours", "save plain", "fsync plain", "load ours", "load plain", "sums verified")
    }
    for repeat in range(args.repeats):
        order = ("ours", "plain") if repeat % 2 == 0 else ("plain", "ours")
        for name in order:
            if name == "ours":
                results["save ours"].append(timed(save_ours))
                # step_{n-1} of the previous repeat is no longer needed: keep the disk use bounded
                for old in (work / "out").glob("step_*"):
                    if old.name != f"step_{step['n']}":
                        shutil.rmtree(old)
            else:
                results["save plain"].append(timed(save_plain))
                results["fsync plain"].append(timed(fsync_plain, sync_first=False))  # what save plain left dirty
        for name in order:
            optimizer.state.clear()  # each load fills a fresh optimizer
            if name == "ours":
                start = time.perf_counter()
                results["load ours"].append(timed(load_ours))
                check_checksums(*jobs, wait=True)
                results["sums verified"].append({"wall_s": time.perf_counter() - start, "cpu_s": float("nan")})
            else:
                results["load plain"].append(timed(load_plain))
            if fingerprint(model, optimizer) != reference:
                raise RuntimeError(f"the {name} load did not restore the saved weights and state")
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s")} for k, v in results.items() if v}
    med["save plain+fsync"] = {
        m: statistics.median(s[m] + f[m] for s, f in zip(results["save plain"], results["fsync plain"]))
        for m in ("wall_s", "cpu_s")
    }
    files = {
        "ours": sum(p.stat().st_size for p in (work / "out" / f"step_{step['n']}").iterdir()),
        "plain": sum(p.stat().st_size for p in plain.iterdir()),
    }
    ratios = {
        "save ours / plain": med["save ours"]["wall_s"] / med["save plain"]["wall_s"],
        "save ours / plain+fsync": med["save ours"]["wall_s"] / med["save plain+fsync"]["wall_s"],
        "load ours / plain": med["load ours"]["wall_s"] / med["load plain"]["wall_s"],
        "save ours / plain (cpu)": med["save ours"]["cpu_s"] / med["save plain"]["cpu_s"],
        "load ours / plain (cpu)": med["load ours"]["cpu_s"] / med["load plain"]["cpu_s"],
    }
    return {
        "num_params": num_params,
        "bytes": files,
        "repeats": args.repeats,
        "verify_checksums": args.verify_checksums,
        "median": med,
        "ratios": ratios,
        "all": results,
    }


def table(result: Dict[str, Any]) -> str:
    med = result["median"]
    gb = result["bytes"]["ours"] / 1e9
    lines = [
        f"{result['num_params'] / 1e9:.2f}B parameters, {gb:.2f} GB per checkpoint (ours), "
        f"median of {result['repeats']} interleaved repeats",
        "",
        "| operation | wall s | CPU s | GB/s (wall) |",
        "|---|---|---|---|",
    ]
    for name in ("save ours", "save plain", "save plain+fsync", "load ours", "load plain", "sums verified"):
        if name in med:
            wall, cpu = med[name]["wall_s"], med[name]["cpu_s"]
            cpu_text = "-" if cpu != cpu else f"{cpu:.2f}"
            lines.append(f"| {name} | {wall:.2f} | {cpu_text} | {gb / wall:.2f} |")
    lines.append("")
    lines += [f"{k}: {v:.2f}x" for k, v in result["ratios"].items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for key, value in DEFAULT_MODEL.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verify-checksums", default="background", choices=["background", "before_load"])
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: the temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    result = run(args)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
