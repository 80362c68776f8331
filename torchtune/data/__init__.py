"""The message layer (torchtune's ``torchtune.data``): ``Message``, the transforms that turn dataset rows
into messages, prompt templates, and the collate functions that batch tokenized samples.

Data flows down: a dataset row -> a ``*ToMessages`` transform -> ``[Message, ...]`` -> a model tokenizer
(``tokenize_messages`` / ``__call__``: ``tokens`` and ``mask``, True = not learnt) -> labels -> a collate
function -> a batch. torchtune's ``torchdata`` loaders (``load_hf_dataset``, ``get_dataloader``) are not
part of this library; the datasets in ``torchtune.datasets`` build on ``datasets`` directly.
"""

from torchtune.data._collate import (
    left_pad_sequence,
    padded_collate,
    padded_collate_dpo,
    padded_collate_packed,
    padded_collate_sft,
    padded_collate_tiled_images_and_mask,
)
from torchtune.data._common import CROSS_ENTROPY_IGNORE_IDX, PACK_TYPE
from torchtune.data._messages import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    Role,
    ShareGPTToMessages,
    validate_messages,
)
from torchtune.data._prompt_templates import (
    ChatMLTemplate,
    GrammarErrorCorrectionTemplate,
    PromptTemplate,
    PromptTemplateInterface,
    QuestionAnswerTemplate,
    SummarizeTemplate,
)
from torchtune.data._utils import format_content_with_images, load_image, truncate

__all__ = [
    "AlpacaToMessages",
    "CROSS_ENTROPY_IGNORE_IDX",
    "ChatMLTemplate",
    "ChosenRejectedToMessages",
    "GrammarErrorCorrectionTemplate",
    "InputOutputToMessages",
    "Message",
    "OpenAIToMessages",
    "PACK_TYPE",
    "PromptTemplate",
    "PromptTemplateInterface",
    "QuestionAnswerTemplate",
    "Role",
    "ShareGPTToMessages",
    "SummarizeTemplate",
    "format_content_with_images",
    "left_pad_sequence",
    "load_image",
    "padded_collate",
    "padded_collate_dpo",
    "padded_collate_packed",
    "padded_collate_sft",
    "padded_collate_tiled_images_and_mask",
    "truncate",
    "validate_messages",
]
