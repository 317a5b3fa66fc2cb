"""A GGUF file -> a plain fp32 safetensors Hugging Face folder (done once per model).

transformers dequantises the GGUF; a GGUF-loaded model refuses to serialise ("quantized with
gguf"), so it is re-created from its config, given the loaded state dict and saved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

TokenizerFix = Callable[[Any, Path], Any]  # (tokenizer read from the GGUF, GGUF path) -> tokenizer


class ConversionError(RuntimeError):
    pass


def convert_gguf(
    gguf: Path, out: Path, turn_end: str, fix_tokenizer: TokenizerFix | None = None
) -> None:
    """Dequantise `gguf` into `out`; chat turns end at `turn_end`, which becomes the EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is on screen

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings legitimately appear as "missing" lm_head weights
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ConversionError(
            f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    if fix_tokenizer is not None:
        tokenizer = fix_tokenizer(tokenizer, gguf)
    # GGUF metadata names another EOS than the chat turn end (SmolLM2: <|im_start|>; Gemma 3:
    # <eos>): chat clients, the engine's stop set and the trainer need the turn end.
    tokenizer.eos_token = turn_end
    tokenizer.clean_up_tokenization_spaces = False  # destructive for BPE tokenizers
    generation = loaded.generation_config
    if generation is not None:
        stops = [tokenizer.convert_tokens_to_ids(turn_end)]
        given = generation.eos_token_id
        for token in given if isinstance(given, list) else [given]:
            if token is not None and token not in stops:
                stops.append(int(token))
        generation.eos_token_id = stops[0] if len(stops) == 1 else stops
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if generation is not None:
        generation.save_pretrained(out)
