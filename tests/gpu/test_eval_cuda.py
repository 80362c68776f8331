"""The lm-eval wrapper on a CUDA device: the same scores as lm-eval's HFLM on that device (fp32), and the
eleuther_eval recipe in bf16 through `tune`. Skipped where PyTorch sees no GPU (`make test-gpu` runs it)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")


def _demo_folder(tmp_path):
    from torchtune._assets import asset_path
    from torchtune.training import FullModelHFCheckpointer

    ckpt = FullModelHFCheckpointer(asset_path("demo/base_model"), ["model.safetensors"], output_dir=tmp_path / "o")
    weights = {k: v.float() for k, v in ckpt.load_checkpoint()["model"].items()}
    return ckpt.save_checkpoint({"model": weights}, epoch=0)


def test_cuda_scores_and_generations_equal_hflm_on_cuda(tmp_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from torchtune import config, training
    from torchtune._assets import asset_path
    from torchtune.evaluation._lm import TuneLM
    from torchtune.training import FullModelHFCheckpointer

    folder = _demo_folder(tmp_path)
    cfg = config.load_config("llama2/tiny_eval")
    state = FullModelHFCheckpointer(folder, ["model.safetensors"], output_dir=tmp_path / "x").load_checkpoint()
    model = training.build_model(cfg.model, device=torch.device("cuda"), dtype=torch.float32, state_dict=state["model"])
    tokenizer = config.instantiate(cfg.tokenizer)
    ours = TuneLM(model, tokenizer, batch_size=5)
    ref = HFLM(pretrained=str(folder), device="cuda", batch_size=4, dtype="float32")
    questions = json.loads(open(asset_path("demo/eval/demo_eval.json"), encoding="utf-8").read())["test"]
    ll_args = [(q["prompt"], c) for q in questions[::4] for c in q["choices"]]
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=a, idx=0) for a in ll_args]
    got, want = ours.loglikelihood(reqs, disable_tqdm=True), ref.loglikelihood(reqs, disable_tqdm=True)
    for (ll, greedy), (ref_ll, ref_greedy) in zip(got, want):
        assert ll == pytest.approx(ref_ll, abs=1e-3) and greedy == ref_greedy
    gen = {"until": ["\n"], "do_sample": False, "max_gen_toks": 16}
    gen_reqs = [Instance(request_type="generate_until", doc={}, arguments=(q["prompt"], gen), idx=0) for q in questions]
    assert ours.generate_until(gen_reqs, disable_tqdm=True) == ref.generate_until(gen_reqs, disable_tqdm=True)


def test_eleuther_eval_recipe_on_cuda_in_bf16(tmp_path):
    from tests._helpers.tiny_run import TUNE

    out = tmp_path / "scores.json"
    cmd = [TUNE, "run", "eleuther_eval", "--config", "llama2/tiny_eval", "device=cuda", "dtype=bf16"]
    cmd += [f"results_file={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["device"].startswith("cuda") and data["dtype"] == "bf16"
    assert 0.0 <= data["results"]["demo_mc"]["acc,none"] <= 1.0 and data["n-samples"]["demo_mc"]["effective"] == 40
