"""A model's own tokenizer from its Hugging Face folder: ``tokenizer.json`` through the ``tokenizers``
library, its special tokens and BOS/EOS from ``tokenizer_config.json``, and chat data formatted with the
folder's own chat template (``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``),
rendered with jinja2 as transformers' ``apply_chat_template`` renders it."""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from torchtune._assets import missing_path_hint
from torchtune._errors import TuneError
from torchtune.data._messages import Message
from torchtune.data._utils import truncate
from torchtune.modules.tokenizers._chat_spans import ChatEncoding, chat_spans

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
# Put before a text encoded with trim_leading_whitespace=True and stripped again: a newline is a byte
# token of SentencePiece-style vocabularies that never merges with what follows.
_TRIM_PREFIX = "\n"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _token_text(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json gives it: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


# While a conversation is rendered with its ``{% generation %}`` blocks tracked: the output so far and the
# character span of each block (what ``_GenerationBlocks`` records).
_TRACKING: ContextVar[Optional[Tuple[List[int], List[Tuple[int, int]]]]] = ContextVar(
    "chat_template_tracking", default=None
)


def _generation_tag():
    """The ``{% generation %}...{% endgeneration %}`` tag of transformers' chat templates: it renders its
    body unchanged and, while a render is tracked, records the body's character span (the text the
    assistant writes, by the template's own account)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class _GenerationBlocks(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_block"), [], [], body).set_lineno(lineno)

        def _block(self, caller) -> str:
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                length, blocks = tracking
                blocks.append((length[0], length[0] + len(text)))
            return text

    return _GenerationBlocks


def _compile_template(source: str, origin: str):
    """The template compiled in the environment transformers uses: sandboxed, ``trim_blocks`` and
    ``lstrip_blocks``, loop controls, the ``{% generation %}`` tag, a ``tojson`` that keeps non-ASCII
    text, ``raise_exception`` and ``strftime_now``."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _generation_tag()]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise TuneError(
            f"The chat template of {origin} does not parse: {err.message} (line {err.lineno} of the template). "
            "Use the model's own tokenizer_config.json / chat_template.jinja, or fix that line."
        ) from err


class HFModelTokenizer:
    """Tokenizer of a Hugging Face model folder (Qwen3, Qwen2.5, Mistral, Phi-4 ...).

    * ``encode(text)`` gives ``AutoTokenizer``'s ids: the ``tokenizer.json`` pipeline, special tokens
      written in the text recognised, and what its post-processor puts around a text (Mistral's ``<s>``;
      nothing for Qwen and Phi-4) when ``add_bos``; ``eos_token`` of ``tokenizer_config.json`` after it
      when ``add_eos`` (a dataset ends each example so).
    * ``message_spans`` renders a conversation with the folder's chat template and tokenizes the text
      once, as ``apply_chat_template`` does, and finds from further renders where each message lies: its
      turn and, for an assistant message, its reply (the content and the special token that closes the
      turn, ``<|im_end|>``, ``</s>``).
    * torchtune's model-tokenizer protocol on top of it: ``tokenize_messages(messages)`` returns the ids and
      a mask (True = not learnt) from each ``Message``'s ``masked`` flag (``ChatEncoding.learnt``: an
      unmasked assistant message learns its reply, another unmasked message its whole turn), and calling the
      tokenizer on ``{"messages": [...]}`` adds ``tokens`` and ``mask``, so it is a ``model_transform`` of
      ``SFTDataset``.

    Args:
        path: the ``tokenizer.json`` (config key ``tokenizer.path``); ``tokenizer_config.json``,
            ``chat_template.jinja`` and ``generation_config.json`` are read from its folder.
        max_seq_len: the longest ``tokenize_messages`` returns (cut with ``eos_token`` last), and the datasets'
            default; None for no limit.

    Raises:
        TuneError: a missing or unreadable ``tokenizer.json``, an unreadable ``tokenizer_config.json``, a
            special token it names that the tokenizer does not have, a chat template that does not parse.
    """

    def __init__(self, path: Union[str, Path], max_seq_len: Optional[int] = None) -> None:
        from torchtune.modules.transforms.tokenizers._hf_tokenizer import TokenizerJson

        path = Path(path).expanduser()
        if path.is_dir():
            path = path / TOKENIZER_JSON
        if not path.is_file():
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) does not exist.{missing_path_hint(path)} "
                "Set tokenizer.path to the tokenizer.json in the model folder (`tune download <model> "
                "--output-dir <folder>` puts it there)."
            )
        self.path = path
        self.max_seq_len = max_seq_len
        self._backend = TokenizerJson(path)
        self._tokenizer = self._backend._tokenizer
        folder = path.parent
        self._config = self._read_json(folder / TOKENIZER_CONFIG)
        self.special_tokens_map: Dict[str, str] = {}
        for key in _SPECIAL_KEYS:
            text = _token_text(self._config.get(key))
            if text is not None:
                self.special_tokens_map[key] = text
        # What the post-processor adds around a text: AutoTokenizer's BOS (and EOS) behaviour.
        bare = self._tokenizer.encode("a", add_special_tokens=False).ids
        full = self._tokenizer.encode("a", add_special_tokens=True).ids
        start = next((i for i in range(len(full)) if full[i : i + len(bare)] == bare), 0)
        self._prefix: List[int] = full[:start]
        self._suffix: List[int] = full[start + len(bare) :]
        # A SentencePiece-style tokenizer.json (Mistral's Metaspace, prepend_scheme "first") starts every
        # text with a word-start marker that the same words lack in the middle of a text; a byte-level one
        # (Qwen, Phi-4) adds nothing. See encode(trim_leading_whitespace=True).
        self._trim_prefix: List[int] = self._tokenizer.encode(_TRIM_PREFIX, add_special_tokens=False).ids
        self._marks_text_start = self._encode_after_prefix("a") not in (None, bare)
        bos = self.special_tokens_map.get("bos_token")
        self.bos_id: Optional[int] = self._prefix[0] if self._prefix else (self._id(bos) if bos else None)
        eos = self.special_tokens_map.get("eos_token")
        if eos is None:
            raise TuneError(
                f"{folder / TOKENIZER_CONFIG} names no eos_token, so examples could not be ended. Use the model "
                "folder's own tokenizer_config.json (tokenizer.path must point into that folder)."
            )
        self.eos_id: int = self._id(eos)
        pad = self.special_tokens_map.get("pad_token")
        # Padded positions carry label -100 and follow the real tokens, so any id serves; EOS without one.
        self.pad_id: int = self._id(pad) if pad else self.eos_id
        self.eot_id: int = self.eos_id
        generation = self._read_json(folder / GENERATION_CONFIG)
        stops = generation.get("eos_token_id", [])
        stops = [stops] if isinstance(stops, int) else list(stops or [])
        self.stop_tokens: List[int] = list(dict.fromkeys([self.eos_id, *stops]))
        self._special_ids = set(self._backend.special_tokens.values())
        self._template_source, self._template_origin = self._find_template(folder)
        self._template = None

    # --- files ---------------------------------------------------------------------------------------
    def _read_json(self, path: Path) -> Dict[str, Any]:
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise TuneError(f"{path} is not valid JSON ({err}); use the model folder's own file.") from err
        return data if isinstance(data, dict) else {}

    def _find_template(self, folder: Path) -> Tuple[Optional[str], str]:
        # transformers prefers chat_template.jinja over the tokenizer_config.json entry when both exist.
        jinja_file = folder / CHAT_TEMPLATE_FILE
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8"), str(jinja_file)
        template = self._config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one is the chat template
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        return (template if isinstance(template, str) else None), str(folder / TOKENIZER_CONFIG)

    def _id(self, token: str) -> int:
        idx = self._backend.token_to_id(token)
        if idx is None:
            raise TuneError(
                f"The tokenizer {self.path} has no token '{token}', which its tokenizer_config.json names as a "
                "special token: the two files come from different models. Use the files of one model folder."
            )
        return int(idx)

    # --- encoding ------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, the added special tokens included."""
        return self._backend.vocab_size

    @property
    def special_tokens(self) -> Dict[str, int]:
        """``{text: id}`` of the special tokens (torchtune's ``ModelTokenizer`` attribute)."""
        return dict(self._backend.special_tokens)

    @property
    def chat_template(self) -> Optional[str]:
        """The source of the folder's chat template, None when it has none."""
        return self._template_source

    def encode(
        self, text: str, add_bos: bool = True, add_eos: bool = True, trim_leading_whitespace: bool = False
    ) -> List[int]:
        """Token ids of ``text``; ``add_bos`` adds what ``AutoTokenizer`` adds around a text (its
        post-processor's tokens), ``add_eos`` appends ``eos_token``.

        ``trim_leading_whitespace=True`` encodes ``text`` as the continuation of a text (an Alpaca
        response after its prompt): a SentencePiece-style tokenizer (Mistral) otherwise starts it with a
        ``▁`` that the joined text does not have there, so ``encode(prompt) + encode(response,
        trim_leading_whitespace=True)`` equals ``AutoTokenizer``'s ids of ``prompt + response`` whenever the
        prompt ends at a token boundary (after a newline). Byte-level tokenizers (Qwen, Phi-4) mark no text
        start and encode as without it."""
        ids = None
        if trim_leading_whitespace and self._marks_text_start:
            ids = self._encode_after_prefix(text)
        if ids is None:
            ids = self._backend.encode(text)
        if add_bos:
            ids = self._prefix + ids + self._suffix
        if add_eos and (not ids or ids[-1] != self.eos_id):
            ids = ids + [self.eos_id]
        return ids

    def _encode_after_prefix(self, text: str) -> Optional[List[int]]:
        """Ids of ``text`` encoded after ``_TRIM_PREFIX``, the prefix's own ids removed; ``None`` where the
        prefix merged with the text (then it cannot be cut off)."""
        ids = self._tokenizer.encode(_TRIM_PREFIX + text, add_special_tokens=False).ids
        n = len(self._trim_prefix)
        return ids[n:] if ids[:n] == self._trim_prefix else None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens, -100 and out-of-range ids are left out unless asked for."""
        size = self.vocab_size
        return self._backend.decode(
            [int(i) for i in ids if 0 <= int(i) < size], skip_special_tokens=skip_special_tokens
        )

    # --- chat ----------------------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False) -> str:
        """The text ``apply_chat_template(messages, tokenize=False)`` gives.

        Raises:
            TuneError: the folder has no chat template, or the template fails on these messages (its
                error and line).
        """
        return self._render(messages, add_generation_prompt)[0]

    def _render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, track: bool = False
    ) -> Tuple[str, Optional[List[Tuple[int, int]]]]:
        """The render, and with ``track`` the character spans of its ``{% generation %}`` blocks."""
        import jinja2

        template = self._compiled()
        kwargs = dict(
            messages=[_as_dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=None,
            documents=None,
            **self.special_tokens_map,
        )
        try:
            if not track:
                return template.render(**kwargs), None
            length, blocks = [0], []
            chunks = []
            token = _TRACKING.set((length, blocks))
            try:
                for chunk in template.generate(**kwargs):
                    chunks.append(chunk)
                    length[0] += len(chunk)
            finally:
                _TRACKING.reset(token)
            return "".join(chunks), blocks
        except jinja2.TemplateError as err:
            line = _template_line(err)
            raise TuneError(
                f"The chat template of {self._template_origin} failed on a conversation: {err}{line}. The "
                "conversation may break a rule of the template (roles alternating, a system message first), "
                "or the template needs what this library does not pass (tools, documents)."
            ) from err

    def _compiled(self):
        if self._template_source is None:
            raise TuneError(
                f"The tokenizer folder {self.path.parent} has no chat template (no chat_template.jinja and no "
                "chat_template in tokenizer_config.json): a base model's folder often has none. Use the "
                "instruct model's tokenizer files, or instruction data (torchtune.datasets.instruct_dataset)."
            )
        if self._template is None:
            self._template = _compile_template(self._template_source, self._template_origin)
        return self._template

    def message_spans(
        self, messages: Sequence[Union[Message, Mapping[str, Any]]], add_generation_prompt: bool = False
    ) -> ChatEncoding:
        """A conversation in the model's chat format: its ids, and per message its turn and (assistant
        messages) the tokens the model writes.

        The text is rendered once and tokenized once, so the ids equal ``apply_chat_template``'s. Where
        each message lies is found from further renders of the template (``_chat_spans``), never by
        looking for a message's text: a reply runs from the end of the generation prompt (Qwen3's empty
        ``<think>`` block of the last turn included, which the model writes) through its end-of-turn token,
        whitespace included; a template's ``{% generation %}`` blocks, where it has them, are the replies.

        Raises:
            TuneError: no chat template, or the template fails on the conversation.
        """
        self._compiled()
        messages = [_as_dict(m) for m in messages]
        track = bool(_GENERATION_TAG.search(self._template_source))
        text, blocks = self._render(messages, add_generation_prompt, track=track)
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        tokens = list(encoding.ids)
        is_special = [t in self._special_ids for t in tokens]
        turns, replies = chat_spans(
            messages,
            text,
            encoding.offsets,
            is_special,
            lambda msgs, gen: self._render(msgs, gen)[0],
            add_generation_prompt,
            generation_blocks=blocks,
        )
        return ChatEncoding(tokens=tokens, turns=turns, replies=replies)

    def tokenize_messages(
        self, messages: Sequence[Union[Message, Mapping[str, Any]]], *, add_generation_prompt: bool = False
    ) -> Tuple[List[int], List[bool]]:
        """torchtune's ``tokenize_messages``: the ids of the conversation in the model's chat format (those of
        ``apply_chat_template``) and a mask, True where a token is not learnt.

        What a message's ``masked`` flag covers is found from the template's renders (``message_spans``,
        ``ChatEncoding.learnt``): an unmasked assistant message learns its reply, from the end of the
        generation prompt through its end-of-turn token; an unmasked system, user or tool message learns its
        whole turn; an assistant's header is learnt when it and the message before it are unmasked, and what
        follows the last turn when no message is. So an assistant-only unmask gives the assistant mask of transformers'
        ``return_assistant_tokens_mask``, and no mask at all learns every token. A mapping
        ``{"role", "content"}`` is a message with ``masked=False``. Past ``max_seq_len`` the tokens are cut
        and the last one becomes ``eos_token`` (each kept token keeps its mask), as torchtune's model
        tokenizers cut.

        Raises:
            TuneError: no chat template, or the template fails on the conversation.
        """
        messages = [m if isinstance(m, Message) else Message.from_dict(m) for m in messages]
        encoded = self.message_spans(messages, add_generation_prompt=add_generation_prompt)
        tokens, mask = encoded.tokens, encoded.mask([m.masked for m in messages])
        if self.max_seq_len is not None and len(tokens) > self.max_seq_len:
            tokens, mask = truncate(tokens, self.max_seq_len, self.eos_id), truncate(mask, self.max_seq_len)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask`` (torchtune's model transform). With
        ``inference`` the conversation ends with the generation prompt; an empty last assistant message (how
        torchtune asks for a reply) is left out first."""
        messages = list(sample.pop("messages"))
        if inference and messages and _role(messages[-1]) == "assistant" and not _text(messages[-1]):
            messages = messages[:-1]
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages, add_generation_prompt=inference)
        return sample

    def __repr__(self) -> str:
        return f"HFModelTokenizer(path='{self.path}', vocab_size={self.vocab_size})"


def _as_dict(message: Union[Message, Mapping[str, Any]]) -> Dict[str, Any]:
    """A message as the chat template reads it: ``{"role", "content"}`` (a ``Message``'s text), and any
    other key of a mapping."""
    if isinstance(message, Message):
        if message.contains_media:
            raise TuneError(f"A {message.role} message holds an image; this library's chat templates render text only.")
        return {"role": message.role, "content": message.text_content}
    return dict(message)


def _role(message: Union[Message, Mapping[str, Any]]) -> Any:
    return message.role if isinstance(message, Message) else message.get("role")


def _text(message: Union[Message, Mapping[str, Any]]) -> str:
    return message.text_content if isinstance(message, Message) else str(message.get("content") or "")


def _template_line(err: Exception) -> str:
    lineno = getattr(err, "lineno", None)
    if lineno is None:
        import traceback

        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == "<template>"]
        lineno = frames[-1].lineno if frames else None
    return f" (line {lineno} of the template)" if lineno else ""
