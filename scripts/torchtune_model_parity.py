"""Cross-check the model builders against torchtune 0.6.1 itself: same state-dict keys, same numbers.

Two steps, each in its own environment (torchtune and this library share the import name ``torchtune``):

1. In a venv with torchtune 0.6.1 installed, from a directory that is not this repository::

       python /path/to/scripts/torchtune_model_parity.py dump /tmp/tt_parity.pt

   builds each tiny random model of ``CASES`` with torchtune's component builders (weights drawn from a
   fixed seed) and saves its state dict (torchtune's own key format, what its
   ``FullModelTorchTuneCheckpointer`` writes) and its fp32 logits for fixed tokens; and builds each model
   builder of ``BUILDERS`` on the meta device, saving every parameter's shape and the sizes, epsilons,
   RoPE bases and windows of its modules.

2. Here (``PYTHONPATH`` at this repository)::

       python scripts/torchtune_model_parity.py check /tmp/tt_parity.pt

   loads each state dict into our builder (``strict=True``) and compares the logits (fp32, atol 1e-5), and
   compares every builder's shapes and settings; it prints one line per case and exits 1 on a difference
   that is not a documented one (``EXPECTED``).

It fetches nothing and is not run by CI (CI has no torchtune venv); the tests in ``tests/torchtune/models``
check the same layouts against transformers instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Dict, Tuple

import torch

VOCAB = 96
LLAMA = dict(vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=64)
WITH_FF = dict(LLAMA, intermediate_dim=96)
GEMMA = dict(
    vocab_size=VOCAB, num_layers=3, num_heads=4, head_dim=16, num_kv_heads=2, embed_dim=48, intermediate_dim=96,
    max_seq_len=64,
)  # fmt: skip

# name: (torchtune builder, its arguments, our builder, our arguments)
CASES: Dict[str, Tuple[str, Dict[str, Any], str, Dict[str, Any]]] = {
    "llama2": ("torchtune.models.llama2.llama2", WITH_FF, "torchtune.models.llama2.llama2", WITH_FF),
    "llama2_default_ff": ("torchtune.models.llama2.llama2", LLAMA, "torchtune.models.llama2.llama2", LLAMA),
    "llama3": ("torchtune.models.llama3.llama3", WITH_FF, "torchtune.models.llama3.llama3", WITH_FF),
    "llama3_1": ("torchtune.models.llama3_1.llama3_1", WITH_FF, "torchtune.models.llama3_1.llama3_1", WITH_FF),
    "llama3_2": ("torchtune.models.llama3_2.llama3_2", WITH_FF, "torchtune.models.llama3_2.llama3_2", WITH_FF),
    "mistral": ("torchtune.models.mistral.mistral", WITH_FF, "torchtune.models.mistral.mistral", WITH_FF),
    "mistral_classifier": (
        "torchtune.models.mistral.mistral_classifier",
        dict(WITH_FF, num_classes=3),
        "torchtune.models.mistral.mistral_classifier",
        dict(WITH_FF, num_classes=3),
    ),
    "phi3": ("torchtune.models.phi3.phi3", WITH_FF, "torchtune.models.phi3.phi3", WITH_FF),
    # torchtune's Phi-4 is its phi3 builder (RoPE base 10000: see EXPECTED for phi4_14b)
    "phi4": ("torchtune.models.phi3.phi3", WITH_FF, "torchtune.models.phi4.phi4", dict(WITH_FF, rope_base=10_000)),
    "qwen2": ("torchtune.models.qwen2.qwen2", WITH_FF, "torchtune.models.qwen2.qwen2", WITH_FF),
    "qwen2_tied": (
        "torchtune.models.qwen2.qwen2",
        dict(WITH_FF, tie_word_embeddings=True),
        "torchtune.models.qwen2.qwen2",
        dict(WITH_FF, tie_word_embeddings=True),
    ),
    # torchtune's Qwen2.5 builders are its qwen2 one; ours also has qwen2_5 (epsilon 1e-6 by default)
    "qwen2_5": (
        "torchtune.models.qwen2.qwen2",
        dict(WITH_FF, norm_eps=1e-6, tie_word_embeddings=True),
        "torchtune.models.qwen2_5.qwen2_5",
        dict(WITH_FF, tie_word_embeddings=True),
    ),
    "gemma": ("torchtune.models.gemma.gemma", GEMMA, "torchtune.models.gemma.gemma", GEMMA),
    # torchtune 0.6.1 caps Gemma 2's normed hidden states, not its logits: ours with soft_cap_hidden_states
    "gemma2": (
        "torchtune.models.gemma2.gemma2",
        dict(GEMMA, sliding_window_size=8, query_pre_attn_scalar=24),
        "torchtune.models.gemma2.gemma2",
        dict(GEMMA, sliding_window_size=8, query_pre_attn_scalar=24, soft_cap_hidden_states=True),
    ),
}

BUILDERS = (
    "llama2.llama2_7b llama2.llama2_13b llama2.llama2_70b llama3.llama3_8b llama3.llama3_70b llama3_1.llama3_1_8b "
    "llama3_1.llama3_1_70b llama3_1.llama3_1_405b llama3_2.llama3_2_1b llama3_2.llama3_2_3b mistral.mistral_7b "
    "phi3.phi3_mini phi4.phi4_14b qwen2.qwen2_0_5b qwen2.qwen2_1_5b qwen2.qwen2_7b qwen2_5.qwen2_5_0_5b "
    "qwen2_5.qwen2_5_1_5b_base qwen2_5.qwen2_5_1_5b_instruct qwen2_5.qwen2_5_3b qwen2_5.qwen2_5_7b_base "
    "qwen2_5.qwen2_5_7b_instruct qwen2_5.qwen2_5_14b_base qwen2_5.qwen2_5_14b_instruct qwen2_5.qwen2_5_32b_base "
    "qwen2_5.qwen2_5_32b_instruct qwen2_5.qwen2_5_72b_base qwen2_5.qwen2_5_72b_instruct gemma.gemma_2b "
    "gemma.gemma_7b gemma2.gemma2_2b gemma2.gemma2_9b gemma2.gemma2_27b"
).split()

# Settings where our builders differ from torchtune 0.6.1's on purpose (docs/models.md says why): builder ->
# {setting: (torchtune's, ours)}. Everything else must be equal.
EXPECTED = {
    "mistral.mistral_7b": {"sliding_window": (None, 4096)},
    "phi3.phi3_mini": {"sliding_window": (None, 2047)},
    "phi4.phi4_14b": {"base": (10_000, 250_000.0)},
    "gemma2.gemma2_2b": {"softcap": (30.0, 50.0), "final_softcap": (50.0, 30.0)},
    "gemma2.gemma2_9b": {"softcap": (30.0, 50.0), "final_softcap": (50.0, 30.0)},
    "gemma2.gemma2_27b": {"softcap": (30.0, 50.0), "final_softcap": (50.0, 30.0)},
}

# State-dict keys that differ on purpose: builder -> {torchtune's key: ours}. torchtune's Gemma 2 keeps its
# final norm inside the module that caps the normed hidden states (ours with soft_cap_hidden_states=True).
EXPECTED_KEYS = {
    f"gemma2.{size}": {"norm.rms_norm.scale": "norm.scale"} for size in ("gemma2_2b", "gemma2_9b", "gemma2_27b")
}

# module attribute -> the setting it holds (torchtune's Gemma 2 spells two of them otherwise)
_SETTINGS = {
    "eps": "eps",
    "base": "base",
    "max_seq_len": "max_seq_len",
    "num_heads": "num_heads",
    "num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "scale_factor": "scale_factor",
    "sliding_window": "sliding_window",
    "sliding_window_size": "sliding_window",
    "softcap": "softcap",
    "softcapping": "softcap",
    "scale": "scale",
    "scaling": "scale",
}
_FINAL_CAP = ("TiedLinear", "Gemma2FinalNorm", "TanhSoftCapping")
SEQ = 24


def _build(path: str, kwargs: Dict[str, Any]) -> torch.nn.Module:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**kwargs)


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def _settings(model: torch.nn.Module) -> Dict[str, Any]:
    """``{setting: value}`` over the model's modules: one value per setting where all modules agree, else a
    sorted tuple of the values (a layer pattern shows as several)."""
    found: Dict[str, set] = {}
    for _, module in model.named_modules():
        if type(module).__name__ in _FINAL_CAP:
            cap = getattr(module, "softcap", None) or getattr(module, "capping_value", None)
            if cap is not None:
                found.setdefault("final_softcap", set()).add(float(cap))
            continue
        for attr, setting in _SETTINGS.items():
            value = vars(module).get(attr)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found.setdefault(setting, set()).add(float(value))
    windows = {
        getattr(m, "sliding_window", getattr(m, "sliding_window_size", None))
        for _, m in model.named_modules()
        if hasattr(m, "q_proj")
    }
    out = {k: (next(iter(v)) if len(v) == 1 else tuple(sorted(v))) for k, v in found.items()}
    out["sliding_window"] = next(iter(windows)) if len(windows) == 1 else tuple(sorted(windows, key=str))
    return out


def dump(path: str) -> None:
    import torchtune

    assert str(getattr(torchtune, "__version__", "")).startswith("0.6.1"), "run `dump` with torchtune 0.6.1 installed"
    out: Dict[str, Any] = {"cases": {}, "builders": {}}
    for name, (tt_path, tt_kwargs, _, _) in CASES.items():
        torch.manual_seed(0)
        model = _build(tt_path, tt_kwargs)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, 0.2)
            logits = model.eval()(_tokens())
        out["cases"][name] = {"state_dict": model.state_dict(), "logits": logits}
    for builder in BUILDERS:
        with torch.device("meta"):
            model = _build(f"torchtune.models.{builder}", {})
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        out["builders"][builder] = {"shapes": shapes, "settings": _settings(model)}
    torch.save(out, path)
    print(f"wrote {path}: {len(CASES)} models, {len(BUILDERS)} builders")


def check(path: str) -> int:
    ref = torch.load(path, weights_only=False)
    bad = 0
    for name, (_, _, ours_path, ours_kwargs) in CASES.items():
        model = _build(ours_path, ours_kwargs).eval()
        case = ref["cases"][name]
        model.load_state_dict(case["state_dict"], strict=True)
        with torch.no_grad():
            diff = (model(_tokens()) - case["logits"]).abs().max().item()
        ok = diff <= 1e-5
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:20s} state dict loads (strict); max |logits - torchtune's| = {diff:.2e}")
    # torchtune's Gemma 2 state dict given to a Gemma 2 built as transformers computes it: refused, with advice
    args = dict(CASES["gemma2"][3], soft_cap_hidden_states=False)
    try:
        _build(CASES["gemma2"][2], args).load_state_dict(ref["cases"]["gemma2"]["state_dict"])
        print("BAD gemma2 (default)   torchtune's state dict loaded without a word")
        bad += 1
    except Exception as err:  # noqa: BLE001 - reported, whatever it is
        print(f"ok  gemma2 (default)   torchtune's state dict refused: {str(err)[:90]}...")
    for builder, want in ref["builders"].items():
        with torch.device("meta"):
            model = _build(f"torchtune.models.{builder}", {})
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        problems = []
        renamed = EXPECTED_KEYS.get(builder, {})
        if renamed:
            print(f"    {builder}: keys {renamed} (documented)")
            want = dict(want, shapes={renamed.get(k, k): v for k, v in want["shapes"].items()})
        if shapes != want["shapes"]:
            missing, extra = sorted(set(want["shapes"]) - set(shapes)), sorted(set(shapes) - set(want["shapes"]))
            differ = sorted(k for k in set(shapes) & set(want["shapes"]) if shapes[k] != want["shapes"][k])
            problems.append(f"keys missing {missing[:4]} extra {extra[:4]} shapes differ {differ[:4]}")
        settings = _settings(model)
        expected = EXPECTED.get(builder, {})
        for key in sorted(set(settings) | set(want["settings"])):
            theirs, ours = want["settings"].get(key), settings.get(key)
            if theirs == ours:
                continue
            if key in expected and expected[key] == (theirs, ours):
                print(f"    {builder}: {key} torchtune {theirs}, ours {ours} (documented)")
                continue
            problems.append(f"{key}: torchtune {theirs}, ours {ours}")
        bad += bool(problems)
        verdict = "; ".join(problems) or "same keys, shapes and settings"
        print(f"{'ok ' if not problems else 'BAD'} {builder:28s} {verdict}")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["dump", "check"])
    parser.add_argument("path")
    args = parser.parse_args()
    if args.step == "dump":
        dump(args.path)
        return 0
    return check(args.path)


if __name__ == "__main__":
    sys.exit(main())
