"""Generate text from a checkpoint: the base model, or any ``epoch_N`` / ``step_N`` folder a finetune wrote.

    tune run generate --config generate prompt="What is 7 plus 5?"
    tune run generate --config generate checkpointer.checkpoint_dir=/tmp/torchtune/demo/epoch_0 \
        prompt="Reverse the letters of the word." input=apple

Copy it with ``tune cp generate my_generate.py`` and edit it: everything the run does is in this file.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict

import torch
from omegaconf import DictConfig

from torchtune import config, training, utils
from torchtune._errors import ConfigError
from torchtune.generation import generate

# Every key this recipe reads; each one is in recipes/configs/generate.yaml. Anything else is a typo.
RECIPE_KEYS = (
    "model",
    "checkpointer",
    "tokenizer",
    "device",
    "dtype",
    "seed",
    "instruction_template",
    "prompt",
    "input",
    "max_new_tokens",
    "temperature",
    "top_k",
)


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, file or device: keys, the decoding values, the prompt,
    the template, device and dtype spellings. ``__init__`` runs it first; ``tune validate`` runs it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    config.check_recipe_keys(cfg, RECIPE_KEYS, "generate", "generate.yaml")
    training.check_value_types(cfg)
    utils.parse_device(cfg.device)
    utils.dtype_name(cfg.dtype)
    if isinstance(cfg.max_new_tokens, bool) or not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a whole number of at least 1, got {cfg.max_new_tokens!r}.")
    if isinstance(cfg.temperature, bool) or not isinstance(cfg.temperature, (int, float)) or cfg.temperature < 0:
        raise ConfigError(f"temperature must be a number >= 0 (0 is greedy), got {cfg.temperature!r}.")
    if cfg.top_k is not None and (isinstance(cfg.top_k, bool) or not isinstance(cfg.top_k, int) or cfg.top_k < 1):
        raise ConfigError(f"top_k must be a whole number of at least 1, or null, got {cfg.top_k!r}.")
    format_prompt(cfg)  # an empty prompt, an unknown template or an input the template has no field for


def format_prompt(cfg: DictConfig) -> str:
    """``cfg.prompt`` as-is, or filled into ``cfg.instruction_template``."""
    if cfg.prompt is None or str(cfg.prompt) == "":
        raise ConfigError('prompt is empty: pass one on the command line, e.g. prompt="What is 7 plus 5?".')
    if cfg.instruction_template is None:
        return str(cfg.prompt)
    from torchtune.datasets import resolve_template

    template = resolve_template(cfg.instruction_template)
    fields = template.columns + template.optional_columns
    sample: Dict[str, Any] = {fields[0]: str(cfg.prompt)}
    if cfg.input is not None and str(cfg.input) != "":
        if len(fields) < 2:
            raise ConfigError(
                f"input={cfg.input!r} was given, but instruction_template "
                f"{template!r} has no input field; set input=null."
            )
        sample[fields[1]] = str(cfg.input)
    return template.format(sample)


class InferenceRecipe:
    """Load a model from ``cfg.checkpointer``, format ``cfg.prompt`` and print the completion.

    Features:
        - any checkpoint the checkpointer reads (Hugging Face or Meta format; a finetune's ``epoch_N``);
        - the prompt as-is, or through an instruction template (``instruction_template``, e.g.
          ``torchtune.datasets.AlpacaInstructTemplate``: ``prompt`` is the instruction, ``input`` its
          optional input field);
        - greedy decoding (``temperature: 0``) or sampling with temperature and ``top_k``, seeded by
          ``seed``; generation stops at the tokenizer's EOS (and Llama 3's <|eot_id|>) or after
          ``max_new_tokens``.

    Raises:
        ConfigError: unknown or missing keys, a bad ``max_new_tokens`` / ``temperature`` / ``top_k``.
        TuneError: missing checkpoint or tokenizer files, weights that do not fit ``model``, a prompt
            longer than the model's ``max_seq_len``.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        self._seed = utils.set_seed(cfg.seed)

    def setup(self, cfg: DictConfig) -> None:
        """Build checkpointer, model (with the checkpoint's weights) and tokenizer."""
        checkpointer = config.instantiate(cfg.checkpointer)
        training.check_model_matches_checkpoint(cfg.model, checkpointer)  # before any weight is read
        model = training.build_model(
            cfg.model, device=self._device, dtype=self._dtype, state_dict=checkpointer.load_checkpoint()["model"]
        )
        self._model = model.eval()
        self._tokenizer = config.instantiate(cfg.tokenizer)

    def generate(self, cfg: DictConfig) -> str:
        """Generate the completion of the formatted prompt, print it and return it."""
        prompt = format_prompt(cfg)
        tokens = self._tokenizer.encode(prompt, add_bos=True, add_eos=False)
        generator = torch.Generator(device=self._device).manual_seed(self._seed)
        start = time.perf_counter()
        new_tokens = generate(
            self._model,
            tokens,
            cfg.max_new_tokens,
            temperature=float(cfg.temperature),
            top_k=cfg.top_k,
            # Llama 3's tokenizer also stops at <|eot_id|>, where a chat model ends its turn.
            stop_tokens=tuple(getattr(self._tokenizer, "stop_tokens", (self._tokenizer.eos_id,))),
            pad_id=self._tokenizer.pad_id,
            generator=generator,
        )
        seconds = time.perf_counter() - start
        completion = self._tokenizer.decode(new_tokens)
        print(prompt + completion)
        print(
            f"[{len(new_tokens)} tokens in {seconds:.2f}s, {len(new_tokens) / max(seconds, 1e-9):.1f} tokens/s]",
            file=sys.stderr,
        )
        return completion


@config.parse
def recipe_main(cfg: DictConfig) -> str:
    """Generate a completion of ``prompt`` with the model in ``checkpointer``."""
    recipe = InferenceRecipe(cfg)
    recipe.setup(cfg)
    return recipe.generate(cfg)


if __name__ == "__main__":
    recipe_main()
