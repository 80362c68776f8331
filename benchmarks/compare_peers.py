"""Our recipe against the peers a user would pick instead, over one whole epoch, side by side in one run.

    python3 -m venv /tmp/tt061 && /tmp/tt061/bin/pip install torch==2.13.0 torchtune==0.6.1 torchao==0.11.0
    python3 -m venv /tmp/trlenv && /tmp/trlenv/bin/pip install torch==2.13.0 trl datasets sentencepiece protobuf
    python3 -m venv /tmp/litenv && /tmp/litenv/bin/pip install torch==2.13.0 litgpt sentencepiece
    .venv/bin/python benchmarks/compare_peers.py --tt-python /tmp/tt061/bin/python --trl-python /tmp/trlenv/bin/python \
        --litgpt-python /tmp/litenv/bin/python

The figure is **trained (label) tokens per second over one whole epoch** of an Alpaca-like data set
of ``--examples`` rows (prompts masked: only the answers carry labels), not a few steps: data order,
packing, padding, the first step's warm-up (and compile) and every step of the epoch are in it. Each
peer runs in its own process and virtual environment on the same random-weight Llama2 in Hugging Face
format (``--size``), the same SentencePiece tokenizer and the same rows, with the same optimizer
(fused AdamW, lr 2e-5, no weight decay, constant LR, no gradient clipping), batch size and sequence
length, packing as each does it best:

- ``ours``: ``full_finetune_single_device``, ``dataset.packed: True`` (best-fit packs),
  ``VocabChunkedCrossEntropyLoss`` (8 vocabulary slices) over the labelled positions only, optimizer in
  backward grouped by layer;
- ``torchtune``: torchtune 0.6.1's ``full_finetune_single_device`` with ``dataset.packed: True``
  (greedy packs), its chunked loss, optimizer in backward;
- ``trl``: TRL's ``SFTTrainer`` (on transformers' ``Trainer``) with ``packing=True`` (best-fit
  decreasing, padding-free batches) and its completion-only loss on prompt/completion rows rendered
  with the same Alpaca template; a standard optimizer step (TRL has no optimizer in backward), no
  gradient clipping (``max_grad_norm=0``; ``Trainer`` still computes the gradient norm every step for
  its log). Its fused LM head projects only the labelled positions on CUDA/XPU (Triton), every
  position elsewhere, a CPU included;
- ``litgpt``: litgpt's ``finetune_full`` (on Lightning Fabric) with its ``JSON`` data, the Alpaca
  prompt style and ``mask_prompt``, from the same checkpoint converted by litgpt's own converter (once
  per run, left out of set-up); no packing (each batch padded to its longest row), logits at every
  position, a standard optimizer step, precision ``bf16-true`` or ``32-true``. Its LR schedule is a
  warm-up of at least one step (the first step runs at LR 0), then constant (``min_lr`` = LR). It
  picks its device itself and has no compile switch.

``--compile`` turns on compile for ours and torchtune (TRL's ``torch_compile``): on a CPU it costs
minutes of compiling per run, which the whole-epoch figure then includes.

The epoch's time runs from its first forward to the end of its last step (ours and torchtune: the
start of the epoch-end save; TRL: its last step's end; litgpt: its training loop's end, which comes
once it has fetched the next epoch's first batch); set-up (imports, model load, data preparation,
packing) is reported apart. Runs alternate between the peers, ``--repeats``
times, the starting peer rotating; the table shows medians over the repeats, wall time beside the
process's CPU time. Padding: the share of positions in the trained batches that hold no real token.

dtype ``auto`` is bf16 on CUDA or on a CPU with native bf16 matmuls (AVX512-BF16/AMX), else fp32: on
an AVX2-only CPU a bf16 matmul runs ~70x slower than fp32, so a bf16 comparison there would measure the
emulation, not the recipes. The dtype run is printed with the reason.

A second table profiles the same runs step by step (``benchmarks/step_profile.py``): forward, loss
(output projection and cross-entropy forward), backward (less the optimizer steps inside it),
optimizer, data (fetching the next batch) and other (logging, metrics, the loop), as the median per
step and the total over the epoch, wall and CPU time, from hooks that work alike in every peer: forward
hooks on the model, on where its output projection starts (ours: in its loss module, on the labelled
rows; torchtune: the model's chunked output projection; TRL: after the decoder stack, where its fused
LM head takes over; litgpt: its ``lm_head``) and on the loss module or function, torch.optim's global
step hooks, and wrappers of ``Tensor.backward`` and of the data loader's ``next()``. Ours' optimizer
time is its whole update (``step_parameter``: with bf16 stochastic rounding, the fp32 copies and the
rounding around ``step()``). The table's footer gives the timestamps taken per step (a few microseconds
each); ``--variant "unprofiled:env:COMPARE_PEERS_PROFILE=0"`` measures what they cost, ``--no-profile``
leaves them out everywhere.

``--variant NAME:SPEC`` (repeatable; ``--extra`` as in ``compare_torchtune.py``) adds a variant of our
recipe to the same interleaved runs: SPEC is ``;``-separated ``tune run`` overrides and ``env:VAR=value``
settings, e.g. ``--variant "keep freed host memory:env:TUNE_KEEP_FREED_HOST_MEMORY=1"`` (the recipe's
opt-in host allocator setting; docs/recipe.md, ``device``) or ``--variant "no stochastic
rounding:bf16_stochastic_rounding=False"``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

_PROCESS_START = time.perf_counter()  # a worker's set-up is timed from here: the peer's imports included

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # appended, not prepended: torchtune 0.6.1's worker must import its own torchtune, not this repo's
    sys.path.append(str(REPO_ROOT))

from benchmarks import compare_torchtune as tt  # noqa: E402  (data, tokenizer and recipe configs)
from benchmarks.step_profile import PHASES, StepProfile, split_steps  # noqa: E402

PEERS = ("ours", "torchtune", "trl", "litgpt")
PROFILE_ENV = "COMPARE_PEERS_PROFILE"  # "0": a worker runs without the step profile's hooks


def _profiling() -> bool:
    return os.environ.get(PROFILE_ENV, "1") != "0"


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """``(dtype, why)`` for ``--dtype``: ``auto`` picks bf16 where matmuls run natively in it."""
    if dtype != "auto":
        return dtype, "as asked (--dtype)"
    if device.startswith("cuda"):
        return "bf16", "auto: CUDA"
    import torch

    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "bf16", "auto: this CPU multiplies bf16 natively"
    return "fp32", "auto: this CPU has no native bf16 matmul (AVX2 only): bf16 would run emulated, ~70x slower"


def prepare(work: Path, args: argparse.Namespace) -> Dict[str, Path]:
    """Checkpoint (random weights), tokenizer and ``--examples`` Alpaca-like rows shared by every peer."""
    from tests._helpers.tiny_run import make_hf_checkpoint

    rows = tt.alpaca_like_rows(args.examples)
    data = work / "data.json"
    data.write_text(json.dumps(rows))
    corpus = [tt.ALPACA_PROMPT] * 20 + [" ".join(r.values()) for r in rows[:400]]
    tokenizer = tt.make_tokenizer(work / "tok", corpus, tt.SIZES[args.size]["vocab_size"])
    ckpt = make_hf_checkpoint(work / "base", seed=0, **tt.SIZES[args.size])
    return {"data": data, "tokenizer": tokenizer, "checkpoint": ckpt}


def recipe_config(impl: str, assets: Dict[str, Path], out: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """Our or torchtune's config: compare_torchtune's best settings for Alpaca data, one whole epoch."""
    ns = argparse.Namespace(**{**vars(args), "scenario": "alpaca", "steps": None})
    cfg = tt.config(impl, assets, out, ns)  # constant LR for both (no lr_scheduler)
    cfg["log_every_n_steps"] = 10  # as a user would; every step logged would time the logging
    if impl == "ours":
        # Our fastest loss for a short step: ~950 labelled rows a step here, so each of 8 row chunks would
        # rewrite the whole 32000 x 1024 weight gradient; vocabulary slices write each slice of it once
        # (benchmarks/bench_loss.py, docs/speed.md). --variant "row-chunked loss:loss._component_=
        # torchtune.modules.loss.ChunkedCrossEntropyLoss" runs the other one beside it.
        cfg["loss"] = {"_component_": "torchtune.modules.loss.VocabChunkedCrossEntropyLoss", "num_output_chunks": 8}
    return cfg


# --- workers (each runs in its peer's own venv) ------------------------------------------------------


def _recipe_worker(impl: str, config_path: Path, result_path: Path) -> None:
    from omegaconf import OmegaConf

    started = _PROCESS_START
    cfg = OmegaConf.load(config_path)
    recipe = tt._load_recipe(impl, cfg)
    model = recipe._model
    loader = recipe._data.dataloader if impl == "ours" else recipe._dataloader
    marks: List[tuple] = []
    model.register_forward_pre_hook(lambda module, a: marks.append((time.perf_counter(), time.process_time())))
    profile = None
    if _profiling():
        # ours computes the output projection in its loss, on the labelled rows; torchtune in the model's
        # forward, one call of model.output per chunk, then its loss module on the chunks
        head = model.output if impl == "torchtune" else None
        calls = []
        if impl == "ours":  # a bf16 step with stochastic rounding: fp32 copies, step(), rounding: all optimizer
            from torchtune.training.optim import _optimizer

            calls.append((_optimizer, "step_parameter"))
        profile = StepProfile().attach(model, head=head, loss=recipe._loss_fn, optimizer_calls=calls)
    end: List[tuple] = []
    save = recipe.save_checkpoint

    def timed_save(*a: Any, **k: Any) -> Any:
        if not end:
            end.append((time.perf_counter(), time.process_time()))
        return save(*a, **k)

    recipe.save_checkpoint = timed_save
    recipe.train()
    if profile is not None:
        profile.detach()
    recipe.cleanup()
    loader.sampler.set_epoch(0)  # the epoch's batches again, in the run's order (seed, epoch)
    batches = list(loader)[: len(marks)]
    _write_result(result_path, started, marks, end[0], batches, profile)


def _trl_worker(config_path: Path, result_path: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import LlamaForCausalLM, LlamaTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    started = _PROCESS_START
    cfg = json.loads(config_path.read_text())
    rows = json.loads(Path(cfg["data"]).read_text())
    template = {
        "with_input": (
            "Below is an instruction that describes a task, paired with an input that provides further "
            "context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
        ),
        "no_input": (
            "Below is an instruction that describes a task. Write a response that appropriately completes "
            "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
        ),
    }
    data = Dataset.from_list(
        [
            {
                "prompt": template["with_input" if r["input"] else "no_input"].format(**r),
                "completion": r["output"],
            }
            for r in rows
        ]
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg["dtype"]]
    tokenizer = LlamaTokenizer.from_pretrained(str(Path(cfg["tokenizer"]).parent))
    tokenizer.pad_token = tokenizer.unk_token
    model = LlamaForCausalLM.from_pretrained(cfg["checkpoint"], dtype=dtype, attn_implementation="sdpa")
    marks: List[tuple] = []
    steps_done: List[tuple] = []
    batches: List[Dict[str, Any]] = []
    model.register_forward_pre_hook(
        lambda module, a, k: marks.append((time.perf_counter(), time.process_time())), with_kwargs=True
    )
    # SFTTrainer's fused LM head projects after the decoder stack (model.base_model) without calling
    # lm_head as a module, and computes the loss inside the model's forward
    profile = StepProfile().attach(model, head=model.base_model, head_event="post") if _profiling() else None

    class StepEnd(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            steps_done.append((time.perf_counter(), time.process_time()))

    sft = SFTConfig(
        output_dir=cfg["output_dir"],
        per_device_train_batch_size=cfg["batch_size"],
        num_train_epochs=1,
        max_length=cfg["seq_len"],
        packing=True,
        completion_only_loss=True,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping, as ours and torchtune here (the default 1.0 clips every step)
        optim="adamw_torch_fused",
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        bf16=cfg["dtype"] == "bf16",
        use_cpu=cfg["device"] == "cpu",
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        torch_compile=cfg["compile"],
        gradient_checkpointing=False,
    )
    trainer = SFTTrainer(model=model, args=sft, train_dataset=data, processing_class=tokenizer, callbacks=[StepEnd()])
    collate = trainer.data_collator

    def recording_collate(features: Any) -> Any:
        batch = collate(features)
        batches.append({k: batch[k].clone() for k in ("input_ids", "labels") if k in batch})
        return batch

    trainer.data_collator = recording_collate
    trainer.train()
    if profile is not None:
        profile.detach()
    # The model shifts the labels inside its loss: the targets trained are labels[:, 1:] != -100.
    trained = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    positions = [int(b["input_ids"].numel()) for b in batches]
    _dump(result_path, started, marks, steps_done[-1], trained, positions, positions, profile)


def _litgpt_worker(config_path: Path, result_path: Path) -> None:
    import shutil

    import litgpt.finetune.full as full
    from litgpt import config as lit_config
    from litgpt.args import EvalArgs, TrainArgs
    from litgpt.data import JSON
    from litgpt.scripts.convert_hf_checkpoint import convert_hf_checkpoint

    cfg = json.loads(config_path.read_text())
    work = Path(cfg["output_dir"]) / "litgpt"
    converting = time.perf_counter()
    checkpoint = _litgpt_checkpoint(work / "checkpoint", cfg, lit_config, convert_hf_checkpoint)
    started = _PROCESS_START + (time.perf_counter() - converting)  # a user converts once: not set-up
    # litgpt's JSON data reads train.json and val.json from a folder; the validation rows feed only the
    # sanity check it runs before training (2 batches in eval mode, before the epoch's first forward)
    rows = json.loads(Path(cfg["data"]).read_text())
    data_dir = work / "data"
    data_dir.mkdir()
    (data_dir / "train.json").write_text(json.dumps(rows))
    (data_dir / "val.json").write_text(json.dumps(rows[:2]))

    marks: List[tuple] = []
    batches: List[Dict[str, Any]] = []
    end: List[tuple] = []
    profile = StepProfile() if _profiling() else None
    fit = full.fit

    def timed_fit(**kwargs: Any) -> Any:  # litgpt calls fit with keywords only
        model = kwargs["state"]["model"].module  # the GPT inside Fabric's wrapper
        model.register_forward_pre_hook(
            lambda module, a: marks.append((time.perf_counter(), time.process_time())) if module.training else None
        )
        if profile is not None:
            # the output projection is the model's last module (logits at every position); the loss, a
            # function on them, follows outside the model
            profile.attach(model, head=model.lm_head, loss_calls=[(full, "chunked_cross_entropy")])
        loader = kwargs["train_dataloader"]
        loader = getattr(loader, "_dataloader", loader)  # Fabric's wrapper
        collate = loader.collate_fn

        def recording_collate(samples: Any) -> Any:
            batch = collate(samples)
            real = int(batch["token_counts"]["raw_plus_prompt_template"].sum())
            batches.append({"input_ids": batch["input_ids"].clone(), "labels": batch["labels"].clone(), "real": real})
            return batch

        loader.collate_fn = recording_collate
        try:
            return fit(**kwargs)
        finally:
            end.append((time.perf_counter(), time.process_time()))
            if profile is not None:
                profile.detach()

    full.fit = timed_fit
    # after the epoch, litgpt saves its hyperparameters by parsing sys.argv as its own command line, which
    # this worker's is not
    full.save_hyperparameters = lambda *a, **k: None
    full.setup(
        checkpoint,
        out_dir=work / "out",
        precision={"bf16": "bf16-true", "fp32": "32-true"}[cfg["dtype"]],
        data=JSON(json_path=data_dir, mask_prompt=True, prompt_style="alpaca", num_workers=0),
        train=TrainArgs(
            save_interval=None,
            log_interval=10,
            global_batch_size=cfg["batch_size"],
            micro_batch_size=cfg["batch_size"],
            # litgpt's schedule is a linear warm-up (at least one step) then a cosine decay to min_lr:
            # with min_lr = lr it is constant after the first step, which runs at LR 0
            lr_warmup_steps=1,
            min_lr=2e-5,
            epochs=1,
            max_seq_length=cfg["seq_len"],
        ),
        eval=EvalArgs(interval=10**9, max_new_tokens=100, initial_validation=False, final_validation=False),
        optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 2e-5, "weight_decay": 0.0, "fused": True}},
        logger_name="csv",
        seed=0,
    )
    # The epoch ends when the next batch comes from the next epoch: that batch was collated, not trained.
    batches = batches[: len(marks)]
    # The model predicts labels[:, 1:] (the loss shifts them): those not -100 are trained.
    trained = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    positions = [int(b["input_ids"].numel()) for b in batches]
    _dump(result_path, started, marks, end[0], trained, positions, [b["real"] for b in batches], profile)
    shutil.rmtree(work, ignore_errors=True)  # a converted checkpoint and the final save per run


def _litgpt_checkpoint(folder: Path, cfg: Dict[str, Any], lit_config: Any, convert: Any) -> Path:
    """The shared HF checkpoint and tokenizer as a litgpt checkpoint folder. litgpt converts checkpoints
    of models it knows by name: this Llama2 is registered under a name of its own, Llama-2-7b-hf's
    architecture with the checkpoint's sizes."""
    import shutil

    folder.mkdir(parents=True)
    for f in Path(cfg["checkpoint"]).iterdir():
        shutil.copy(f, folder / f.name)
    shutil.copy(cfg["tokenizer"], folder / "tokenizer.model")
    # litgpt's Tokenizer reads whether to add BOS from here (it does for Llama2, as ours and TRL do)
    tokenizer = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    hf = json.loads((folder / "config.json").read_text())
    name = "compare-peers-llama2"
    if name not in lit_config.name_to_config:
        arch = dict(lit_config.name_to_config["Llama-2-7b-hf"])
        arch.update(
            name=name,
            block_size=hf["max_position_embeddings"],
            vocab_size=hf["vocab_size"],
            padded_vocab_size=hf["vocab_size"],
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            n_query_groups=hf["num_key_value_heads"],
            n_embd=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            norm_eps=hf["rms_norm_eps"],
            rope_base=int(hf["rope_theta"]),
        )
        lit_config.configs.append(arch)
        lit_config.name_to_config[name] = arch
    convert(folder, model_name=name)
    (folder / "model.safetensors").unlink()  # converted into lit_model.pth
    return folder


def _write_result(
    path: Path, started: float, marks: List[tuple], end: tuple, batches: List[Any], profile: StepProfile | None
) -> None:
    trained = [int((b["labels"] != -100).sum()) for b in batches]  # our and torchtune's labels are shifted
    positions = [int(b["tokens"].numel()) for b in batches]
    real = [int((b["tokens"] != 0).sum()) for b in batches]  # both pad with id 0 (the Llama2 tokenizer's pad)
    _dump(path, started, marks, end, trained, positions, real, profile)


def _dump(path: Path, started: float, marks, end, trained, positions, real, profile: StepProfile | None) -> None:
    result = {
        "setup_s": marks[0][0] - started,
        "epoch_wall_s": end[0] - marks[0][0],
        "epoch_cpu_s": end[1] - marks[0][1],
        "steps": len(trained),
        "trained": trained,
        "positions": positions,
        "real": real,
    }
    if profile is not None:
        result["profile"] = split_steps(profile.events, end)
        result["profile_timestamps"] = len(profile.events)  # what the hooks cost: a few microseconds each
    path.write_text(json.dumps(result))


# --- orchestration ----------------------------------------------------------------------------------


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, float]:
    """Medians over the repeats of one peer's whole-epoch figures."""
    per = [
        {
            "tok_s": sum(r["trained"]) / r["epoch_wall_s"],
            "tok_cpu_s": sum(r["trained"]) / r["epoch_cpu_s"],
            "epoch_wall_s": r["epoch_wall_s"],
            "epoch_cpu_s": r["epoch_cpu_s"],
            "setup_s": r["setup_s"],
            "steps": r["steps"],
            "trained": sum(r["trained"]),
            "padding": 1 - sum(r["real"]) / max(1, sum(r["positions"])),
        }
        for r in runs
    ]
    return {k: statistics.median(p[k] for p in per) for k in per[0]}


def summarize_profile(runs: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]] | None:
    """``{phase: {"step_wall_s", "step_cpu_s", "epoch_wall_s", "epoch_cpu_s"}}``: each run's median per
    step and total over the epoch, then the median over the repeats; None for runs without a profile."""
    if not runs or any("profile" not in r for r in runs):
        return None
    out: Dict[str, Dict[str, float]] = {}
    for phase in (*PHASES, "step"):
        out[phase] = {}
        for clock in ("wall", "cpu"):
            per_step = [r["profile"][phase][clock] for r in runs]
            out[phase][f"step_{clock}_s"] = statistics.median(statistics.median(p) for p in per_step)
            out[phase][f"epoch_{clock}_s"] = statistics.median(sum(p) for p in per_step)
    out["timestamps"] = {"per_step": statistics.median(r["profile_timestamps"] / r["steps"] for r in runs)}
    return out


def print_profile(profiles: Dict[str, Dict[str, Dict[str, float]]]) -> None:
    """The per-step profile tables (median per step; totals over the epoch) of the peers that have one."""
    if not profiles:
        return
    header = "| peer | " + " | ".join(PHASES) + " | {} |\n|---|" + "---|" * (len(PHASES) + 1)
    print(
        "\nWhere a step's time goes, from the same runs (benchmarks/step_profile.py): median per step, ms, "
        "wall / CPU (the medians need not add up to the step's)\n"
    )
    print(header.format("step"))
    for name, p in profiles.items():
        cells = [f"{1e3 * p[k]['step_wall_s']:.1f} / {1e3 * p[k]['step_cpu_s']:.1f}" for k in (*PHASES, "step")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nTotal over the epoch, s, wall / CPU (share of the epoch's wall time)\n")
    print(header.format("epoch"))
    for name, p in profiles.items():
        epoch = p["step"]["epoch_wall_s"]
        cells = [
            f"{p[k]['epoch_wall_s']:.2f} / {p[k]['epoch_cpu_s']:.2f} ({100 * p[k]['epoch_wall_s'] / epoch:.0f}%)"
            for k in PHASES
        ]
        cells.append(f"{epoch:.2f} / {p['step']['epoch_cpu_s']:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    stamps = ", ".join(f"{name} {p['timestamps']['per_step']:.0f}" for name, p in profiles.items())
    print(f"\nTimestamps the profile took per step (a few microseconds each): {stamps}")


def run_plan(peers: List[str], variant_specs: List[str]) -> List[Dict[str, Any]]:
    """The runs of one repeat: each peer, then each ``--variant`` of ours (``compare_torchtune.parse_extra``)."""
    plan = [{"name": p, "impl": p, "label": p, "overrides": [], "env": {}} for p in peers]
    for spec in variant_specs:
        variant = tt.parse_extra(spec)
        plan.append({**variant, "impl": "ours", "label": f"ours, {variant['name']}"})
    names = [r["name"] for r in plan]
    if len(set(names)) != len(names):
        raise SystemExit(f"--variant: every run needs its own name, got {names} (peers included)")
    return plan


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="any of ours, torchtune, trl, litgpt (comma-separated)"
    )
    parser.add_argument("--tt-python", default="/tmp/tt061/bin/python", help="python of the torchtune 0.6.1 venv")
    parser.add_argument("--trl-python", default="/tmp/trlenv/bin/python", help="python of the TRL venv")
    parser.add_argument("--litgpt-python", default="/tmp/litenv/bin/python", help="python of the litgpt venv")
    parser.add_argument("--size", default="168m", choices=sorted(tt.SIZES))
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="compile for every peer (minutes per run on a CPU)")
    parser.add_argument(
        "--variant",
        "--extra",
        action="append",
        default=[],
        metavar="NAME:SPEC",
        help="a variant of our recipe in the same interleaved runs: key=value overrides and env:VAR=value, "
        "';'-separated (see the docstring)",
    )
    parser.add_argument("--no-profile", action="store_true", help="run every peer without the step profile's hooks")
    parser.add_argument("--json", dest="json_out", type=Path)
    parser.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "trl":
        return _trl_worker(Path(args.config), Path(args.result))
    if args.worker == "litgpt":
        return _litgpt_worker(Path(args.config), Path(args.result))
    if args.worker:
        return _recipe_worker(args.worker, Path(args.config), Path(args.result))

    import shutil

    import yaml

    args.dtype, why = resolve_dtype(args.dtype, args.device)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise SystemExit(f"--peers: unknown {unknown}; choose from {list(PEERS)}")
    plan = run_plan(peers, args.variant)
    pythons = {
        "ours": sys.executable,
        "torchtune": args.tt_python,
        "trl": args.trl_python,
        "litgpt": args.litgpt_python,
    }
    for impl in {r["impl"] for r in plan}:
        if not Path(pythons[impl]).exists():
            raise SystemExit(f"{impl}: {pythons[impl]} does not exist; make its venv (see the module docstring)")
    work = Path(tempfile.mkdtemp(prefix="compare_peers_"))
    assets = prepare(work, args)
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "PYTHONPATH": str(REPO_ROOT),  # the workers import benchmarks.compare_torchtune (not our package)
    }
    if args.no_profile:
        env[PROFILE_ENV] = "0"
    runs: Dict[str, List[Dict[str, Any]]] = {r["name"]: [] for r in plan}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        shift = repeat % len(plan)  # each run takes each place in the order in turn: drift hits all alike
        for index, entry in enumerate(plan[shift:] + plan[:shift]):
            name, impl = entry["name"], entry["impl"]
            out = work / f"run{repeat}_{index}"
            out.mkdir()
            cfg_path, res_path = out / "config.yaml", out / "result.json"
            if impl in ("trl", "litgpt"):
                cfg = {
                    "data": str(assets["data"]),
                    "tokenizer": str(assets["tokenizer"]),
                    "checkpoint": str(assets["checkpoint"]),
                    "output_dir": str(out),
                    "batch_size": args.batch_size,
                    "seq_len": args.seq_len,
                    "dtype": args.dtype,
                    "device": args.device,
                    "compile": args.compile,
                }
                cfg_path.write_text(json.dumps(cfg))
            else:
                recipe_cfg = recipe_config(impl, assets, out, args)
                if entry["overrides"]:
                    recipe_cfg = tt.our_config(recipe_cfg, entry["overrides"])
                cfg_path.write_text(yaml.safe_dump(recipe_cfg))
            print(f"repeat {repeat + 1}: {entry['label']} ...", file=sys.stderr, flush=True)
            worker_env = env if impl != "torchtune" else {k: v for k, v in env.items() if k != "PYTHONPATH"}
            cmd = [pythons[impl], __file__, "--worker", impl, "--config", str(cfg_path), "--result", str(res_path)]
            proc = subprocess.run(
                cmd, cwd=str(work), env={**worker_env, **entry["env"]}, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise SystemExit(f"{entry['label']} failed:\n{proc.stderr[-4000:]}")
            res = json.loads(res_path.read_text())
            runs[name].append(res)
            print(
                f"  epoch {res['epoch_wall_s']:.1f}s wall, {res['epoch_cpu_s']:.1f}s CPU, {res['steps']} steps, "
                f"{sum(res['trained'])} trained tokens",
                file=sys.stderr,
                flush=True,
            )
            for d in out.glob("epoch_*"):
                shutil.rmtree(d, ignore_errors=True)
            if args.json_out:
                args.json_out.write_text(json.dumps({"args": vars(args) | {"json_out": None}, "runs": runs}))
    shutil.rmtree(work, ignore_errors=True)
    labels = {r["name"]: r["label"] for r in plan}
    summaries = {name: summarize(runs[name]) for name in runs}
    profiles = {name: p for name in runs if (p := summarize_profile(runs[name])) is not None}
    print(
        f"\nOne epoch of {args.examples} Alpaca-like rows, Llama2 {tt.SIZES[args.size]}, {args.dtype} ({why}) on "
        f"{args.device}, batch {args.batch_size} x {args.seq_len}, prompts masked, compile "
        f"{'on' if args.compile else 'off'}; {args.repeats} interleaved run(s) per peer, "
        f"{time.perf_counter() - started:.0f}s in all\n"
    )
    base = summaries.get("ours")
    print(
        "| peer | steps | trained tokens | padding | epoch wall (s) | epoch CPU (s) | trained tokens/s (wall) | "
        "trained tokens/s (CPU) | ours vs peer (wall, CPU) | set-up (s) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for name, s in summaries.items():
        ratio = (
            ""
            if base is None or name == "ours"
            else (f"{base['tok_s'] / s['tok_s']:.2f}x, {base['tok_cpu_s'] / s['tok_cpu_s']:.2f}x")
        )
        print(
            f"| {labels[name]} | {s['steps']:.0f} | {s['trained']:.0f} | {100 * s['padding']:.1f}% | "
            f"{s['epoch_wall_s']:.1f} | {s['epoch_cpu_s']:.1f} | {s['tok_s']:.1f} | {s['tok_cpu_s']:.1f} | {ratio} | "
            f"{s['setup_s']:.1f} |"
        )
    print_profile({labels[name]: p for name, p in profiles.items()})
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json_out": None},
                    "runs": runs,
                    "summary": summaries,
                    "profile": profiles,
                    "labels": labels,
                }
            )
        )
    return summaries


if __name__ == "__main__":
    main()
