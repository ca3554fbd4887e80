"""The chat format of relaxspec's base LMs: one definition for every server (docs/design.md §7).

Our models are base LMs, not chat-tuned: each message becomes one line ``"<Role>: <content>"``
(roles ``System``, ``User``, ``Assistant``; ``developer`` renders as ``System``; a list of text
parts is concatenated), the prompt ends with the assistant's cue ``"Assistant:"``, and generation
stops at ``"\\nUser:"``.

:func:`render_chat` is what our own server renders (:class:`relaxspec.serve.server.ChatTemplate`);
:data:`CHAT_TEMPLATE` is the same format as a Hugging Face chat template (Jinja), stored as the
bundled tokenizers' ``chat_template.jinja`` (what ``save_pretrained`` writes; the tokenizer
trainer sets it), so vLLM's chat endpoint — ``relaxspec serve --engine vllm`` and stock ``vllm
serve`` alike — renders the same prompt. ``tests/test_chat_format.py`` checks the two agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

ROLE_LABELS: dict[str, str] = {
    "system": "System",
    "developer": "System",
    "user": "User",
    "assistant": "Assistant",
}
CUE = "Assistant:"
STOP: tuple[str, ...] = ("\nUser:",)


def render_chat(
    turns: Iterable[tuple[str, str]], labels: Mapping[str, str] = ROLE_LABELS, cue: str = CUE
) -> str:
    """``[(role, text), ...]`` -> the prompt: one ``"Label: text"`` line per turn, then the cue."""
    lines = [f"{labels[role]}: {text}" for role, text in turns]
    return "\n".join([*lines, cue])


# Jinja's whitespace control ("-") keeps the template's own line breaks out of the prompt; an
# unknown role is an error (``raise_exception`` is provided by transformers and vLLM). The prompt
# starts with the BOS token: chat prompts are tokenized without special tokens (vLLM, transformers),
# our own server encodes the rendered text with them — the same token ids either way.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set labels = " + json.dumps(ROLE_LABELS) + " -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in labels -%}"
    "{{ raise_exception('unsupported chat role: ' ~ message['role']) }}"
    "{%- endif -%}"
    "{%- if not loop.first -%}{{ '\\n' }}{%- endif -%}"
    "{{ labels[message['role']] ~ ': ' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if messages -%}{{ '\\n' }}{%- endif -%}{{ " + json.dumps(CUE) + " }}"
    "{%- endif -%}"
)
