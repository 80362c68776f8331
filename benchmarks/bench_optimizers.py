"""Held-out loss after N training steps, per optimizer, on the same model, data and LR schedule.

    .venv/bin/python benchmarks/bench_optimizers.py                        # the mini model (168M), 200 steps
    .venv/bin/python benchmarks/bench_optimizers.py --steps 100 --layers 2 --dim 256 --vocab-size 1024
    .venv/bin/python benchmarks/bench_optimizers.py --optimizers apollo_mini --set apollo_mini.scale=128

On a slow machine run one process per optimizer, each with ``--optimizers NAME --json DIR/NAME.json``
and the same other arguments, then ``--table DIR/*.json`` prints their table (docs/optimizers.md).

Every optimizer runs the recipe's real training step (``torchtune.training.TrainStep``, built from a
config as ``benchmarks/bench_step.py`` builds it) with optimizer in backward, from identical random
weights, on identical batches. The data is learnable without any download: token sequences drawn from a
fixed random Markov chain over ``--active-vocab`` token ids (each id has ``--successors`` equally likely
next ids, so the best possible loss is ln(successors)); the model keeps its vocabulary (32000 unless
``--vocab-size``). The
held-out loss is the mean cross-entropy of the trained model on batches the chain draws from another
seed. The LR schedule is the recipes' cosine schedule with warm-up, the same for every optimizer.

Reported per optimizer: held-out loss, its ratio to AdamW's, wall seconds and the optimizer state bytes (every tensor
in the per-parameter optimizers' state after the run, projectors included).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from benchmarks.bench_step import DEFAULT_MODEL, bench_config, build_step  # noqa: E402
from torchtune.training.estimate._memory_estimator import _state_bytes  # noqa: E402
from torchtune.training.lr_schedulers import get_cosine_schedule_with_warmup  # noqa: E402

_REST = {"_component_": "torch.optim.AdamW"}
_APOLLO = {
    "_component_": "apollo_torch.APOLLOAdamW",
    "proj": "random",
    "update_proj_gap": 200,
    "proj_type": "std",
    "rest": _REST,
}
# name -> optimizer node (lr and weight_decay are added). Rank, projection and scaling as the authors'
# pre-training scripts set them: APOLLO rank a quarter of the width, random projection, channel-wise
# scaling, scale 1; APOLLO-Mini rank 1, tensor-wise, scale a quarter of the width (its 130M script; 128
# in the 1B/7B ones); GaLore rank a quarter of the width, SVD projection, scale 0.25; a new projection
# every 200 steps. Those scripts pair these scales with LR 0.01, 10x this benchmark's 1e-3. Here every
# optimizer has the same LR schedule, so the 10x moves into ``scale``, which multiplies the update
# (APOLLO: its square root does, so scale x100; GaLore: x10). Measured on a small model
# (docs/optimizers.md), the scripts' scales at LR 1e-3 leave the three 41-73% behind AdamW; with the 10x
# folded in, APOLLO and APOLLO-Mini end ahead of AdamW and GaLore 18% behind. (On the 168M model with
# 16-token steps the scripts' scales did better still: docs/optimizers.md.) APOLLO-Mini's 100x
# ("25*dim") diverged on the 168M model with 256-token steps (held-out loss 5.75 where AdamW reached
# 1.58); "4*dim", 16x its script's quarter width (4096 at 168M, 1024 on the small model), is within 10%
# of AdamW on both (docs/optimizers.md), so it is the default.
# "dim/4" is a quarter of the model width, "4*dim" four times it, "25*dim" 100 times a quarter.
OPTIMIZERS: Dict[str, Any] = {
    "adamw": {"_component_": "torch.optim.AdamW"},
    "bnb_adamw8bit": {"_component_": "bitsandbytes.optim.AdamW8bit"},
    "apollo_mini": {**_APOLLO, "rank": 1, "scale_type": "tensor", "scale": "4*dim"},
    "apollo": {**_APOLLO, "rank": "dim/4", "scale_type": "channel", "scale": 100},
    "galore": {
        "_component_": "galore_torch.GaLoreAdamW",
        "rank": "dim/4",
        "update_proj_gap": 200,
        "scale": 2.5,
        "proj_type": "std",
        "rest": _REST,
    },
}


def markov_batches(
    n: int, batch_size: int, seq_len: int, active: int, successors: int, seed: int
) -> List[Dict[str, torch.Tensor]]:
    """``n`` batches of sequences from the benchmark's fixed Markov chain (its table is seeded apart from
    ``seed``, which only chooses the sequences)."""
    table = torch.randint(1, active, (active, successors), generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(1, active, (batch_size,), generator=gen)
        for t in range(1, seq_len):
            pick = torch.randint(0, successors, (batch_size,), generator=gen)
            tokens[:, t] = table[tokens[:, t - 1], pick]
        batches.append({"tokens": tokens, "labels": tokens.clone()})
    return batches


def optimizer_node(name: str, dim: int, lr: float, changes: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """The optimizer node of ``name`` at width ``dim``, with ``changes`` (``--set``) applied."""
    node = {**json.loads(json.dumps(OPTIMIZERS[name])), **(changes or {})}
    widths = {"dim/4": max(1, dim // 4), "4*dim": 4 * dim, "25*dim": 25 * dim}
    for key in ("rank", "scale"):
        node[key] = widths.get(node.get(key), node.get(key))
    node = {k: v for k, v in node.items() if v is not None}
    node.update(lr=lr, weight_decay=0.0)
    if "rest" in node:
        node["rest"].update(lr=lr, weight_decay=0.0)
    return node


@torch.no_grad()
def held_out_loss(step: Any, batches: List[Dict[str, torch.Tensor]]) -> float:
    from torchtune.training import forward_loss

    step.model.eval()
    losses = [forward_loss(step.model, step.loss_fn, batch, device=step.device).item() for batch in batches]
    step.model.train()
    return sum(losses) / len(losses)


def run_one(
    name: str,
    args: argparse.Namespace,
    train: List[Dict[str, torch.Tensor]],
    held: List[Any],
    changes: Dict[str, Any] | None = None,
) -> Dict:
    model = {**DEFAULT_MODEL, "vocab_size": args.vocab_size, "num_layers": args.layers, "embed_dim": args.dim}
    model["max_seq_len"] = args.seq_len
    model["num_heads"] = model["num_kv_heads"] = max(1, args.dim // 64)
    cfg = bench_config("adamw_bwd", model, args.dtype, args.device, lr=args.lr)
    cfg.optimizer = OmegaConf.create(optimizer_node(name, args.dim, args.lr, changes))
    step = build_step(cfg, weights_seed=0)
    schedule = get_cosine_schedule_with_warmup(
        step.optimizer, num_warmup_steps=args.warmup, num_training_steps=args.steps
    )
    losses = []
    t0 = time.perf_counter()
    for batch in train:
        losses.append(step(batch).item())
        schedule.step()
    inner = getattr(step.optimizer, "optim_map", {"": step.optimizer})
    state = sum(_state_bytes(dict(opt.state), set()) for opt in {id(o): o for o in inner.values()}.values())
    params = sum(p.numel() for p in step.model.parameters())
    loss = held_out_loss(step, held)
    return {
        "held_out_loss": loss,
        "last_train_loss": losses[-1],
        "state_bytes": state,
        "params": params,
        "seconds": time.perf_counter() - t0,  # training and held-out loss, not the model build
        "optimizer": OmegaConf.to_container(cfg.optimizer),
    }


# the arguments that must agree for runs saved apart to share one table
_SAME_RUN = (
    "steps",
    "warmup",
    "lr",
    "layers",
    "dim",
    "batch_size",
    "seq_len",
    "active_vocab",
    "successors",
    "held_out_batches",
    "device",
    "dtype",
)


def merge_runs(paths: List[str]) -> tuple:
    """The arguments and results of runs saved with ``--json`` (e.g. one process per optimizer), checked to
    be the same benchmark; the first run's arguments describe them all."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for run in runs:  # saved before --vocab-size existed: the vocabulary was always the mini model's
        run["args"].setdefault("vocab_size", DEFAULT_MODEL["vocab_size"])
    first = runs[0]["args"]
    results: Dict[str, Any] = {}
    for path, run in zip(paths, runs):
        differ = {k: (first[k], run["args"][k]) for k in _SAME_RUN if run["args"][k] != first[k]}
        if differ:
            raise SystemExit(
                f"{path} is another benchmark than {paths[0]} (first, this: {differ}); a table compares runs "
                f"with the same model, data, steps and LR schedule only, so rerun it with the same arguments"
            )
        results.update(run["results"])
    return argparse.Namespace(**first), results


def print_table(args: argparse.Namespace, results: Dict[str, Dict[str, Any]]) -> None:
    base = results.get("adamw", {}).get("held_out_loss")
    params = next(iter(results.values()))["params"]
    print(
        f"\n{args.layers} layers x {args.dim} dim, vocab {args.vocab_size} ({params / 1e6:.0f}M "
        f"parameters), {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, lr {args.lr} cosine with "
        f"{args.warmup} warm-up steps, {args.dtype}, optimizer in backward; best possible loss "
        f"ln({args.successors}) = {math.log(args.successors):.3f}"
    )
    print(f"{'optimizer':<28}{'held-out loss':>15}{'vs AdamW':>10}{'state MB':>10}{'seconds':>9}")
    for name, r in results.items():
        ratio = f"{r['held_out_loss'] / base:.3f}" if base else "-"
        seconds = f"{r['seconds']:.0f}" if "seconds" in r else "-"
        print(f"{name:<28}{r['held_out_loss']:>15.4f}{ratio:>10}{r['state_bytes'] / 1e6:>10.1f}{seconds:>9}")


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help=f"comma-separated, of {list(OPTIMIZERS)}")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_MODEL["vocab_size"])
    parser.add_argument("--layers", type=int, default=DEFAULT_MODEL["num_layers"])
    parser.add_argument("--dim", type=int, default=DEFAULT_MODEL["embed_dim"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--active-vocab", type=int, default=512)
    parser.add_argument("--successors", type=int, default=4)
    parser.add_argument("--held-out-batches", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="change one optimizer setting, e.g. apollo_mini.scale=128; its row is named with the change",
    )
    parser.add_argument(
        "--table",
        nargs="+",
        default=None,
        metavar="JSON",
        help="only print the table of runs saved with --json (one process per optimizer, say), same arguments",
    )
    args = parser.parse_args(argv)
    if args.table:
        print_table(*merge_runs(args.table))
        return 0
    names = [n for n in args.optimizers.split(",") if n]
    unknown = sorted(set(names) - set(OPTIMIZERS))
    if unknown:
        parser.error(f"unknown optimizers {unknown}; choose from {list(OPTIMIZERS)}")
    changes: Dict[str, Dict[str, Any]] = {}
    for item in args.set:
        name, _, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if name not in names or not key or not eq:
            parser.error(f"--set {item}: expected NAME.KEY=VALUE with NAME one of --optimizers {names}")
        changes.setdefault(name, {})[key] = yaml.safe_load(value)
    train = markov_batches(args.steps, args.batch_size, args.seq_len, args.active_vocab, args.successors, seed=0)
    held = markov_batches(args.held_out_batches, args.batch_size, args.seq_len, args.active_vocab, args.successors, 1)
    results = {}
    for name in names:
        label = " ".join([name, *(f"{k}={v}" for k, v in changes.get(name, {}).items())])
        results[label] = run_one(name, args, train, held, changes.get(name))
        print(label, json.dumps(results[label]), flush=True)
    print_table(args, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
