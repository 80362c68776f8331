"""Where each message of a conversation lies in its tokens, found from the chat template's own renders.

A chat template is code: it may strip a reply, fold the system message into a user turn, drop the
reasoning of earlier turns (Qwen3), or add text only when a conversation ends in a given way. So the
spans are never found by looking for a message's text in the rendered conversation. Instead:

- the conversation is rendered once (``text``) and tokenized once: those are the ids;
- the *content region* of message ``i`` is the stretch of ``text`` that changes when only that
  message's content changes: the template renders the conversation again with that content replaced
  by a probe character that occurs nowhere in ``text``; the common prefix and suffix of the two renders
  bound the region exactly (nothing of the probe can match ``text``). A template that does not render a
  message's content gives the same text back: that message has no region;
- the *end-of-turn token* of message ``i`` is the first special token after its content region (and
  before the next message's): ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``</s>``;
- an assistant reply starts where the model starts writing: after the *generation prompt*, i.e. the
  text the template puts after the previous message's content when rendering ``messages[:i]`` with
  ``add_generation_prompt=True``. In ``text`` the reply starts after the longest stretch following
  the previous content region that agrees with that text, so a template that writes more in the
  assistant's own turn than in its generation prompt (Qwen3's empty ``<think>`` block on the last
  turn) has that written text labelled, and one whose generation prompt is empty (Mistral) has the
  reply start right after the user turn;
- a template with ``{% generation %}`` blocks says itself what the assistant writes: those blocks are
  the replies, as transformers' ``return_assistant_tokens_mask`` takes them.

A token belongs to a span when its characters overlap the span's (transformers' rule), so a token that
joins a template character with the reply's first character is learnt with the reply.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from torchtune._errors import TuneError

CharSpan = Tuple[int, int]
TokenSpan = Tuple[int, int]
Render = Callable[[Sequence[Mapping[str, Any]], bool], str]

# Private-use characters: never in a template, practically never in data, and not whitespace (a
# template's ``trim`` keeps them).
_PROBES = [chr(c) for c in range(0xE000, 0xE100)]


@dataclasses.dataclass(frozen=True)
class ChatEncoding:
    """A tokenized conversation and, per message, its tokens.

    Attributes:
        tokens: the ids, exactly those of the whole rendered conversation tokenized once.
        turns: per message, the token range ``[start, end)`` of its turn: from the end of the previous
            message's turn (0 for the first) through its own end-of-turn token; an empty range for a
            message the template does not render. What follows the last turn (a trailing newline, a
            generation prompt) belongs to no message.
        replies: per message, for an assistant message the token range the model writes: from the end
            of the generation prompt through the end-of-turn token, whitespace included; ``None`` for
            other roles and for a reply the template does not render.
    """

    tokens: List[int]
    turns: List[TokenSpan]
    replies: List[Optional[TokenSpan]]

    def learnt(self, train: Sequence[bool]) -> List[bool]:
        """Which tokens are learnt when message ``i`` is trained exactly where ``train[i]`` (torchtune's
        per-message ``masked``, inverted):

        - a trained assistant message: its reply (what the model writes, through its end-of-turn token);
        - another trained message (system, user, ipython): its whole turn;
        - the header of an assistant turn (the generation prompt before the reply, which ends the prompt the
          reply answers): when that message and the one before it are both trained;
        - what follows the last turn (a template's closing newline, a generation prompt): when every message
          is trained.

        So with every message trained every token is learnt (``train_on_input=True``), and with only the
        assistant messages trained exactly the replies are (``is_assistant``)."""
        mask = [False] * len(self.tokens)
        for i, on in enumerate(train):
            start, end = self.turns[i]
            reply = self.replies[i]
            if reply is None:
                if on:
                    mask[start:end] = [True] * (end - start)
                continue
            if on:
                mask[reply[0] : reply[1]] = [True] * (reply[1] - reply[0])
            if on and i > 0 and train[i - 1]:
                mask[start : reply[0]] = [True] * (reply[0] - start)
        if train and all(train):
            last = max((end for _, end in self.turns), default=0)
            mask[last:] = [True] * (len(self.tokens) - last)
        return mask

    def mask(self, masked: Sequence[bool]) -> List[bool]:
        """torchtune's token mask (True = not learnt) for messages masked where ``masked[i]``: the
        complement of :meth:`learnt` of the unmasked messages."""
        return [not learnt for learnt in self.learnt([not m for m in masked])]

    @property
    def is_assistant(self) -> List[bool]:
        """True for the tokens of the assistant replies: what a model learns by default."""
        mask = [False] * len(self.tokens)
        for reply in self.replies:
            if reply is not None:
                mask[reply[0] : reply[1]] = [True] * (reply[1] - reply[0])
        return mask

    @property
    def message_index(self) -> List[int]:
        """Per token, the message whose turn holds it; -1 after the last turn."""
        index = [-1] * len(self.tokens)
        for i, (start, end) in enumerate(self.turns):
            index[start:end] = [i] * (end - start)
        return index


def free_probe(text: str) -> str:
    """A probe character that does not occur in ``text``."""
    for probe in _PROBES:
        if probe not in text:
            return probe
    raise ValueError("every probe character occurs in the rendered text")  # 256 private-use characters


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i + 256 <= n and a[i : i + 256] == b[i : i + 256]:
        i += 256
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    i = 0
    while i + 256 <= n and a[len(a) - i - 256 : len(a) - i] == b[len(b) - i - 256 : len(b) - i]:
        i += 256
    while i < n and a[len(a) - 1 - i] == b[len(b) - 1 - i]:
        i += 1
    return i


def changed_region(text: str, other: str) -> Optional[CharSpan]:
    """The stretch of ``text`` that differs from ``other`` (None when they are equal)."""
    if text == other:
        return None
    start = common_prefix(text, other)
    tail = common_suffix(text, other, min(len(text), len(other)) - start)
    return start, len(text) - tail


def tokens_overlapping(starts: Sequence[int], ends: Sequence[int], span: CharSpan) -> TokenSpan:
    """The tokens whose characters overlap ``span`` (transformers' rule for ``{% generation %}`` blocks)."""
    first = bisect.bisect_right(ends, span[0])
    return first, max(first, bisect.bisect_left(starts, span[1]))


def tokens_starting_in(starts: Sequence[int], span: CharSpan) -> TokenSpan:
    """The tokens whose first character lies in ``span``: turns split the tokens without overlap."""
    return bisect.bisect_left(starts, span[0]), bisect.bisect_left(starts, span[1])


def chat_spans(
    messages: Sequence[Mapping[str, Any]],
    text: str,
    offsets: Sequence[Tuple[int, int]],
    is_special: Sequence[bool],
    render: Render,
    add_generation_prompt: bool,
    generation_blocks: Optional[List[CharSpan]] = None,
) -> Tuple[List[TokenSpan], List[Optional[TokenSpan]]]:
    """Per message, its turn and (assistant messages) its reply, as token ranges of ``text``.

    Args:
        messages: the conversation (``{"role", "content"}`` mappings).
        text: its render, ``render(messages, add_generation_prompt)``.
        offsets: the character span of each token of ``text`` (one tokenization of the whole text).
        is_special: per token, whether it is a special token (end-of-turn tokens are).
        render: renders a conversation with the chat template; raises ``TuneError`` when it cannot.
        add_generation_prompt: as ``text`` was rendered.
        generation_blocks: the character spans of the ``{% generation %}`` blocks of ``text``, for a
            template that has them (then they are the replies).
    """
    n = len(messages)
    probe = free_probe(text)
    regions = [changed_region(text, render(_with_content(messages, i, probe), add_generation_prompt)) for i in range(n)]
    # In the order the text holds them: a template may render a message later than its place (Mistral
    # folds the system message into the last user turn).
    rendered = sorted((i for i in range(n) if regions[i] is not None), key=lambda i: (regions[i][0], i))
    specials = [offsets[t] for t in range(len(offsets)) if is_special[t]]
    char_turns: List[CharSpan] = [(0, 0)] * n
    char_replies: List[Optional[CharSpan]] = [None] * n
    position = 0
    for k, i in enumerate(rendered):
        content_end = regions[i][1]
        limit = regions[rendered[k + 1]][0] if k + 1 < len(rendered) else len(text)
        eot = next((e for s, e in specials if s >= content_end and e <= limit), content_end)
        char_turns[i] = (position, max(position, eot))
        if generation_blocks is None and messages[i].get("role") == "assistant":
            # the message rendered last before the reply that also comes before it in the conversation
            previous = next((j for j in reversed(rendered[:k]) if j < i), None)
            start = _reply_start(messages, i, previous, regions, text, render)
            char_replies[i] = (max(position, start), char_turns[i][1])
        position = char_turns[i][1]
    for i in range(n):  # a message the template does not render: an empty turn after the message before it
        if regions[i] is None:
            before = [char_turns[j][1] for j in range(i) if regions[j] is not None]
            char_turns[i] = (max(before), max(before)) if before else (0, 0)
    if generation_blocks is not None:
        char_replies = _assign_blocks(generation_blocks, char_turns, rendered, n)
    starts = [s for s, _ in offsets]
    ends = [e for _, e in offsets]
    turns = [tokens_starting_in(starts, span) for span in char_turns]
    replies = [tokens_overlapping(starts, ends, span) if span is not None else None for span in char_replies]
    return turns, replies


def _with_content(messages: Sequence[Mapping[str, Any]], i: int, content: str) -> List[dict]:
    changed = [dict(m) for m in messages]
    changed[i]["content"] = content
    return changed


def _reply_start(
    messages: Sequence[Mapping[str, Any]],
    i: int,
    previous: Optional[int],
    regions: List[Optional[CharSpan]],
    text: str,
    render: Render,
) -> int:
    """Where assistant message ``i`` starts writing in ``text`` (see the module docstring)."""
    content_start = regions[i][0]
    try:
        prompt = render(messages[:i], True)
    except TuneError:  # e.g. a template that reads messages[0] of a reply that opens the conversation
        return content_start
    if previous is None:  # nothing before the reply: the prompt is a prefix of the text, as far as it agrees
        return min(content_start, common_prefix(text, prompt))
    region = changed_region(prompt, render(_with_content(messages[:i], previous, free_probe(prompt)), True))
    if region is None:  # the template renders the previous message only when a reply follows it
        return content_start
    anchor = regions[previous][1]
    return anchor + common_prefix(text[anchor:content_start], prompt[region[1] :])


def _assign_blocks(
    blocks: List[CharSpan], turns: List[CharSpan], rendered: List[int], n: int
) -> List[Optional[CharSpan]]:
    """Each ``{% generation %}`` block goes to the message whose turn it starts in (after the last turn:
    the last message); a message's reply spans its blocks."""
    replies: List[Optional[CharSpan]] = [None] * n
    for a, b in blocks:
        owner = next((i for i in rendered if turns[i][0] <= a < turns[i][1]), rendered[-1] if rendered else None)
        if owner is None:
            continue
        old = replies[owner]
        replies[owner] = (a, b) if old is None else (min(old[0], a), max(old[1], b))
    return replies
