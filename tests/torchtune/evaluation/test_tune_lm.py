"""TuneLM against lm-eval's own Hugging Face model (HFLM) on the same checkpoint folder: per-request
log-likelihoods, rolling log-likelihoods, acc / acc_norm of the bundled task and greedy generations.

The folder is the bundled demo base model saved by our HF checkpointer in fp32 (as a finetune writes it:
config.json, tokenizer.model, tokenizer_config.json), so HFLM and AutoTokenizer read it offline.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

from lm_eval.api.instance import Instance  # noqa: E402

from torchtune import config, evaluation, training  # noqa: E402
from torchtune._assets import asset_path  # noqa: E402
from torchtune.evaluation._lm import TuneLM  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
ARCH = dict(
    _component_="torchtune.models.llama2.llama2",
    vocab_size=1000,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    embed_dim=256,
    max_seq_len=256,
    intermediate_dim=768,
)
QUESTIONS = json.loads(open(asset_path("demo/eval/demo_eval.json"), encoding="utf-8").read())["test"]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """The demo base model as a finetune's output folder: HF format, fp32, with tokenizer files."""
    from torchtune.training import FullModelHFCheckpointer

    out = tmp_path_factory.mktemp("eval_ckpt")
    ckpt = FullModelHFCheckpointer(
        checkpoint_dir=asset_path("demo/base_model"), checkpoint_files=["model.safetensors"], output_dir=out
    )
    weights = {k: v.float() for k, v in ckpt.load_checkpoint()["model"].items()}
    return ckpt.save_checkpoint({"model": weights}, epoch=0)


@pytest.fixture(scope="module")
def model_and_tokenizer(hf_folder):
    from omegaconf import OmegaConf

    from torchtune.training import FullModelHFCheckpointer

    ckpt = FullModelHFCheckpointer(
        checkpoint_dir=hf_folder, checkpoint_files=["model.safetensors"], output_dir=hf_folder.parent / "unused"
    )
    model = training.build_model(
        OmegaConf.create(ARCH),
        device=torch.device("cpu"),
        dtype=torch.float32,
        state_dict=ckpt.load_checkpoint()["model"],
    )
    tokenizer = config.instantiate(
        OmegaConf.create(
            {"_component_": "torchtune.models.llama2.llama2_tokenizer", "path": str(hf_folder / "tokenizer.model")}
        )
    )
    return model, tokenizer


@pytest.fixture(scope="module")
def ours(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    return TuneLM(model, tokenizer, batch_size=3)  # another batch size than HFLM's: padding must not matter


@pytest.fixture(scope="module")
def hflm(hf_folder):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(hf_folder), device="cpu", batch_size=4, dtype="float32")


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_loglikelihoods_equal_hflm(ours, hflm):
    args = [(q["prompt"], choice) for q in QUESTIONS[::5] for choice in q["choices"]]
    args += [("", "7 plus 5 is 12."), ("the word apple has", " 5 letters."), ("apple backwards is ", "elppa.")]
    got = ours.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    want = hflm.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    assert len(got) == len(want) == len(args)
    for (ll, greedy), (ref_ll, ref_greedy), a in zip(got, want, args):
        assert ll == pytest.approx(ref_ll, abs=1e-4), a
        assert greedy == ref_greedy, a
    scores = [ll for ll, _ in want]
    assert max(scores) - min(scores) > 5  # real, varied scores


def test_rolling_loglikelihoods_equal_hflm(model_and_tokenizer, hf_folder):
    from lm_eval.models.huggingface import HFLM

    model, tokenizer = model_and_tokenizer
    texts = [" ".join(q["output"] for q in QUESTIONS), "7 plus 5 is 12. apple backwards is elppa."]
    # max_length 32: the long text spans several windows.
    ours = TuneLM(model, tokenizer, batch_size=2, max_seq_length=32)
    ref = HFLM(pretrained=str(hf_folder), device="cpu", batch_size=4, dtype="float32", max_length=32)
    got = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in texts]), disable_tqdm=True)
    want = ref.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in texts]), disable_tqdm=True)
    assert got == pytest.approx(want, abs=1e-4)
    assert len(tokenizer.encode(texts[0])) > 3 * 32


def test_generate_until_gives_hflm_strings(ours, hflm):
    gen = {"until": ["\n"], "do_sample": False, "max_gen_toks": 16}
    args = [(q["prompt"], gen) for q in QUESTIONS[::3]]
    args += [("7 plus 5 is", {"until": ["."], "do_sample": False, "max_gen_toks": 8})]
    got = ours.generate_until(_requests("generate_until", args), disable_tqdm=True)
    want = hflm.generate_until(_requests("generate_until", args), disable_tqdm=True)
    assert got == want
    assert len(set(want)) > 3 and all("\n" not in s for s in want)


def test_bundled_task_acc_equals_hflm(ours, hflm):
    tasks = evaluation.resolve_tasks(["demo_mc"])
    settings = evaluation.EvalSettings(tasks=("demo_mc",))
    got = evaluation.run_tasks(ours, tasks, settings)["results"]["demo_mc"]
    want = evaluation.run_tasks(hflm, tasks, settings)["results"]["demo_mc"]
    for metric in ("acc,none", "acc_norm,none"):
        assert got[metric] == pytest.approx(want[metric], abs=1e-4), metric
    assert 0 < want["acc,none"] < 1


def test_an_evaluation_outside_a_git_checkout_prints_no_git_error(ours, tmp_path, monkeypatch, capfd):
    """lm-eval records `git describe --always` of the working directory and let git print "fatal: not a git
    repository" on every evaluation run elsewhere; the hash is recorded quietly (None there)."""
    import lm_eval.evaluator

    own = lm_eval.evaluator.get_git_commit_hash
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    results = evaluation.run_tasks(
        ours, evaluation.resolve_tasks(["demo_mc"]), evaluation.EvalSettings(tasks=("demo_mc",), limit=2)
    )
    assert "not a git repository" not in capfd.readouterr().err and results["git_hash"] is None
    assert lm_eval.evaluator.get_git_commit_hash is own  # put back


def test_importing_torchao_through_a_config_says_nothing_and_leaves_its_logger_as_it_was():
    """torchao logs "Failed to load ..." for each CUDA kernel library it cannot load (and torch warns about
    its Enum registration) on import: dropped during that import only."""
    import subprocess
    import sys

    pytest.importorskip("torchao")
    code = (
        "import logging\n"
        "from torchtune.config import import_component\n"
        "import_component('torchao.optim.AdamW8bit')\n"
        "assert not logging.getLogger('torchao').filters and not logging.getLogger('torch.utils._pytree').filters\n"
        "logging.getLogger('torchao').warning('Failed to load later: shown')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "Failed to load later: shown", result.stderr


def test_llama3_loglikelihoods_equal_hflm(tmp_path, llama3_tokenizer_dir):
    """Llama 3's tiktoken tokenizer against the folder's tokenizer.json as HFLM reads it: the same BOS
    (<|begin_of_text|>) handling, so the same scores."""
    from lm_eval.models.huggingface import HFLM
    from omegaconf import OmegaConf

    from tests._helpers.tiny_llama3_run import make_tiny_llama3_run

    cfg = OmegaConf.load(make_tiny_llama3_run(tmp_path, llama3_tokenizer_dir))
    checkpointer = config.instantiate(cfg.checkpointer)
    model = training.build_model(
        cfg.model, device=torch.device("cpu"), dtype=torch.float32, state_dict=checkpointer.load_checkpoint()["model"]
    )
    ours = TuneLM(model, config.instantiate(cfg.tokenizer), batch_size=2)
    ref = HFLM(pretrained=str(cfg.checkpointer.checkpoint_dir), device="cpu", batch_size=3, dtype="float32")
    assert ours.prefix_token_id == ref.prefix_token_id and ours.eot_token_id == ref.eot_token_id
    args = [
        ("What is two plus three?", " Two plus three is five."),
        ("", "The sky is blue."),
        ("Reverse apple:", " elppa"),
        ("<|begin_of_text|>Name a colour of the sky.", " Blue."),  # BOS already in the text: not added again
    ]
    assert ours.tok_encode(args[-1][0]).count(ours.prefix_token_id) == 1
    got = ours.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    want = ref.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    for (ll, greedy), (ref_ll, ref_greedy) in zip(got, want):
        assert ll == pytest.approx(ref_ll, abs=1e-4) and greedy == ref_greedy
