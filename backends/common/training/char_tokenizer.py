"""A character-level HF tokenizer built locally, with a chat template: nothing downloaded.

Tests and the generated arithmetic task need a tokenizer that ``AutoTokenizer`` loads
from a checkpoint directory, as miles loads one from ``--hf-checkpoint`` (miles'
``miles/utils/processing_utils.py``, ``load_tokenizer``). Every character is a token,
so a digit is one token and a small model learns sums digit by digit; LaTeX commands
(``\\boxed``, ``\\frac``) are single tokens, so the answer format of the math reward
(``\\boxed{7}``) costs the model three tokens, not seven.

The chat template is ChatML-shaped with one special token per role, so
``--apply-chat-template`` turns ``3+4=`` into ``<|user|>3+4=<|end|><|assistant|>``.
``<|end|>`` closes every turn and is the EOS token, as ``<|im_end|>`` is for Qwen chat
models: generation stops where the answer's turn ends.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "<|end|>", "<unk>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
COMMANDS = ("\\boxed", "\\frac", "\\text")
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
"""Jinja, as HF chat templates are: each turn ``<|role|>content<|end|>``, and the
assistant's opening tag when a generation prompt is asked for."""

_PIECES = r"\\[a-zA-Z]+|[\s\S]"
"""A LaTeX command or any single character (a newline included): the pre-tokenizer's
split; a command not in COMMANDS is unknown and becomes <unk>, as an unknown character."""


def vocabulary() -> dict[str, int]:
    """Token -> id, special tokens first (pad 0, bos 1, eos 2): fixed, so every
    checkpoint written here shares it."""
    tokens = [*SPECIAL_TOKENS, *COMMANDS, *CHARACTERS]
    return {token: i for i, token in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer as transformers wraps it; ``save_pretrained(dir)`` writes
    tokenizer.json, tokenizer_config.json and the chat template next to the weights."""
    core = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(_PIECES), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
    )
