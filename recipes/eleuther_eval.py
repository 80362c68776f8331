"""Score a checkpoint with EleutherAI's lm-evaluation-harness: the base model, a finetune's ``epoch_N``
folder or a ``step_N`` checkpoint of a run, in Hugging Face or Meta format, or a distributed run's
``step_N`` (its sharded state, read on one process).

    tune run eleuther_eval --config llama2/7B_eval checkpointer.checkpoint_dir=/tmp/torchtune/llama2_7B/epoch_0
    tune run eleuther_eval --config llama2/tiny_eval tasks=[demo_mc,demo_gen]

Needs lm-eval (``pip install "plaintune[eval]"``). Copy it with ``tune cp eleuther_eval my_eval.py`` and
edit it: everything the run does is in this file. docs/eval.md describes the keys and the numbers.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from torchtune import config, evaluation, training, utils

log = logging.getLogger("torchtune")

RECIPE_NAME = "eleuther_eval"
# Every key this recipe reads; each one is in the shipped eval configs. Anything else is a typo.
RECIPE_KEYS = (
    "model",
    "checkpointer",
    "tokenizer",
    "device",
    "dtype",
    "seed",
    "tasks",
    "limit",
    "num_fewshot",
    "batch_size",
    "max_seq_length",
    "results_file",
)


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, file, device or lm-eval: keys, the eval settings,
    device and dtype spellings. ``__init__`` runs it first; ``tune validate`` runs it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    config.check_recipe_keys(cfg, RECIPE_KEYS, RECIPE_NAME, "llama2/7B_eval")
    training.check_value_types(cfg)
    utils.parse_device(cfg.device)
    utils.dtype_name(cfg.dtype)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise config.ConfigError(f"seed must be a whole number (it seeds few-shot sampling), got {cfg.seed!r}.")
    evaluation.eval_settings(cfg, seed=cfg.seed)
    if cfg.results_file is not None and str(cfg.results_file).strip() == "":
        raise config.ConfigError(
            "results_file is empty: set the JSON file the scores are written to, or results_file=null for "
            "eval_results.json next to the checkpoint scored (checkpointer.checkpoint_dir)."
        )


class EleutherEvalRecipe:
    """Evaluate the model in ``cfg.checkpointer`` on lm-eval tasks and write the scores.

    Features:
        - any checkpoint the checkpointer reads (Hugging Face or Meta format, a finetune's ``epoch_N`` or
          ``step_N``), built on ``device`` in ``dtype`` as the finetune builds it; a ``step_N`` of
          ``full_finetune_distributed`` (sharded state only) is read directly, on this one process, with
          ``model`` and ``tokenizer`` from the config (the checkpointer's other keys are not used);
        - any lm-eval task, group or tag by name (``truthfulqa_mc2``, ``mmlu_*``), or a task YAML by path;
          the bundled offline ``demo_mc`` / ``demo_gen`` tasks on the demo data;
        - the model as an lm-eval ``TemplateLM`` (``torchtune.evaluation._lm.TuneLM``): batched
          log-likelihoods, rolling log-likelihoods and KV-cache generation, encoded as lm-eval's own
          Hugging Face model encodes a Llama (BOS first), so scores are comparable with published ones;
        - ``limit``, ``num_fewshot``, ``batch_size``, ``max_seq_length``; lm-eval's table printed, the
          scores written as JSON to ``results_file`` (null, as in the shipped configs: ``eval_results.json``
          next to the checkpoint; for the bundled demo weights, in the working directory).

    Raises:
        ConfigError: unknown or missing keys, bad values of the eval keys.
        TuneError: lm-eval missing (with the install command); an unknown task (with the closest names);
            a task whose data must be downloaded while offline; a ``results_file`` that cannot be
            written (checked before the eval); missing checkpoint or tokenizer files; a distributed
            ``step_N`` without manifest or with a missing or damaged shard;
            weights or a tokenizer that do not fit ``model``; ``max_seq_length`` above the model's.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._settings = evaluation.eval_settings(cfg, seed=cfg.seed)
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        utils.set_seed(cfg.seed)

    def setup(self, cfg: DictConfig) -> None:
        """Find lm-eval and the tasks first (seconds), then build checkpointer, model and tokenizer."""
        evaluation.import_lm_eval()
        self._results_file = evaluation.check_writable(
            evaluation.results_path(cfg.results_file, cfg.checkpointer.checkpoint_dir)
        )
        self._tasks = evaluation.resolve_tasks(self._settings.tasks)
        self._checkpoint_dir = Path(cfg.checkpointer.checkpoint_dir).expanduser()
        if training.holds_only_sharded_weights(self._checkpoint_dir):
            # a distributed step_N: its torch.distributed.checkpoint shards, in our names, read on this process
            state_dict = training.load_sharded_model(self._checkpoint_dir)
        else:
            checkpointer = config.instantiate(cfg.checkpointer)
            training.check_model_matches_checkpoint(cfg.model, checkpointer)  # before any weight is read
            state_dict = checkpointer.load_checkpoint()["model"]
        model = training.build_model(cfg.model, device=self._device, dtype=self._dtype, state_dict=state_dict)
        tokenizer = config.instantiate(cfg.tokenizer)
        training.check_tokenizer_fits_model(tokenizer, model, cfg.tokenizer)
        self._lm = evaluation.build_lm(model, tokenizer, self._settings)

    def evaluate(self, cfg: DictConfig) -> dict:
        """Run the tasks, print lm-eval's table and write ``results_file``; returns lm-eval's results."""
        start = time.perf_counter()
        results = evaluation.run_tasks(self._lm, self._tasks, self._settings)
        seconds = time.perf_counter() - start
        print(evaluation.results_table(results))
        path = evaluation.write_results(
            results,
            self._results_file,
            extra={
                "checkpoint_dir": str(self._checkpoint_dir),
                "model": str(cfg.model._component_),
                "device": str(self._device),
                "dtype": utils.dtype_name(cfg.dtype),
                "settings": self._settings.as_dict(),
                "seconds": round(seconds, 1),
            },
        )
        log.info("Scores written to %s (%.0f s)", path, seconds)
        return results


@config.parse
def recipe_main(cfg: DictConfig) -> dict:
    """Entry point: ``tune run eleuther_eval --config ...``."""
    logging.basicConfig(level=logging.INFO, handlers=[training.ProgressBarLogHandler(sys.stderr)])
    recipe = EleutherEvalRecipe(cfg)
    recipe.setup(cfg)
    return recipe.evaluate(cfg)


if __name__ == "__main__":
    recipe_main()
