"""Gemma 3's tokenizer out of its GGUF metadata, and the chat template the GGUF file lacks.

transformers (5.17) reads a Gemma GGUF vocabulary as a Unigram model, but Gemma's SentencePiece
model is BPE and the GGUF scores are merge ranks (-rank), not log-probabilities: read as Unigram,
"hello" became `hel` + `lo` and "The capital of France is" 10 pieces instead of 5, no BOS was
added, and the model (which needs `<bos>`) answered "is is is …". Rebuilt as BPE with merges
ordered by those scores, the pieces match Gemma's (`hello` = 23391, `▁capital` = 5279).

The GGUF published on PyPI is the pretrained `google/gemma-3-270m` (no chat template in its
metadata), so the template below is Gemma 3's turn format (`<start_of_turn>user|model`), with
tools described in the system text and tool calls / results in the Hermes convention
(`<tool_call>{…}</tool_call>`, `<tool_response>…</tool_response>`) that the engine parses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOS, EOS, END_OF_TURN = "<bos>", "<eos>", "<end_of_turn>"
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='', pending='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- if tools -%}"
    "{%- set ns.system = (ns.system + '\\n\\n' if ns.system else '')"
    " + 'You can call functions. Their JSON schemas are:\\n<tools>\\n' -%}"
    "{%- for tool in tools -%}"
    "{%- set ns.system = ns.system + ((tool.function if tool.function is defined else tool)"
    " | tojson) + '\\n' -%}"
    "{%- endfor -%}"
    "{%- set ns.system = ns.system + '</tools>\\nTo call one, answer with <tool_call>"
    '{"name": <function-name>, "arguments": <arguments-object>}'
    "</tool_call>' -%}"
    "{%- endif -%}"
    "{%- set ns.pending = ns.system -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{%- if ns.pending and role == 'user' -%}"
    "{{ ns.pending + '\\n\\n' }}{%- set ns.pending = '' -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{ '<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- else -%}{{ (message['content'] or '') | trim }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message.tool_calls is defined"
    " and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{ '\\n<tool_call>' + ({'name': fn.name, 'arguments': fn.arguments} | tojson)"
    " + '</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if ns.pending -%}"
    "{{ '<start_of_turn>user\\n' + ns.pending + '<end_of_turn>\\n' }}"
    "{%- endif -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def gguf_token_types(gguf: Path) -> list[int]:
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields["tokenizer.ggml.token_type"]
    return [int(t) for t in field.contents()]


def bpe_spec(unigram_spec: dict[str, Any], token_types: list[int]) -> dict[str, Any]:
    """A tokenizers JSON spec: the Unigram one transformers built, turned into BPE + BOS."""
    from transformers.tokenization_utils_base import generate_merges

    pieces: list[tuple[str, float]] = [(p, s) for p, s in unigram_spec["model"]["vocab"]]
    vocab = {piece: index for index, (piece, _) in enumerate(pieces)}
    added = [
        {
            "id": index,
            "content": piece,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for index, ((piece, _), kind) in enumerate(zip(pieces, token_types, strict=True))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    skip: set[str] = {str(token["content"]) for token in added}
    merges = generate_merges(vocab, dict(pieces), skip_tokens=skip)
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    return {
        **unigram_spec,
        "added_tokens": added,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(merge) for merge in merges],
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                bos,
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [vocab[BOS]], "tokens": [BOS]}},
        },
    }


def gemma_tokenizer(loaded: Any, gguf: Path) -> Any:
    """Gemma 3's BPE tokenizer (BOS added, turns end at `<end_of_turn>`) with its chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = bpe_spec(json.loads(loaded.backend_tokenizer.to_str()), gguf_token_types(gguf))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        bos_token=BOS,
        eos_token=END_OF_TURN,
        unk_token="<unk>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
