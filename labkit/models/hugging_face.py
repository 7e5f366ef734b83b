"""Hugging Face models the kit did not write, built from their configs (random weights: nothing is downloaded),
at the shapes of a GPTConfig, to hold lab 07's planner and PyTorch's against: GPT-2 and Llama.

Their blocks sit where Hugging Face puts them ("transformer.h", "model.layers"), called with a mask, positions
and (Llama) rotary tables besides the hidden state; the planners take them with ``blocks=BLOCKS[name]``.
``transformers`` is a developer extra: without it, ``build`` says how to install it.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.models.gpt import GPTConfig

# the vocabulary sizes of their tokenizers (the configs' vocab_size: GPT-2's, and Llama 3's 128K tokens)
VOCABS = {"gpt2": 50_257, "llama3": 128_256}

__all__ = ["BLOCKS", "build", "logits_loss"]

BLOCKS = {"gpt2": "transformer.h", "llama": "model.layers"}  # where each keeps its blocks


def build(name: str, cfg: GPTConfig, vocab: int, seed: int = 0) -> nn.Module:
    """GPT-2 or Llama (`name`) with cfg's hidden size, heads, layers and sequence length, its dropout on
    attention (Llama) or everywhere (GPT-2), `vocab` tokens, the cache off, on cfg's device default (the CPU)."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("labkit.models.hugging_face: transformers is not installed; pip install transformers "
                          "(the kit's developer extra, .[dev], has it)") from e
    if name not in BLOCKS:
        raise ValueError(f"build: name={name!r}; allowed: {', '.join(BLOCKS)}")
    torch.manual_seed(seed)
    if name == "gpt2":
        config: Any = transformers.GPT2Config(
            n_layer=cfg.n_layers, n_embd=cfg.hidden, n_head=cfg.heads, n_positions=cfg.seq, vocab_size=vocab,
            resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, use_cache=False,
            bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        num_hidden_layers=cfg.n_layers, hidden_size=cfg.hidden, intermediate_size=4 * cfg.hidden,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads, max_position_embeddings=cfg.seq,
        vocab_size=vocab, attention_dropout=cfg.dropout, use_cache=False)
    return transformers.LlamaForCausalLM(config)


def logits_loss(tokens: torch.Tensor) -> Any:
    """out -> next-token cross entropy of a Hugging Face output's logits on `tokens` (the kit's loss)."""
    from labkit.models.gpt import next_token_loss

    return lambda out: next_token_loss(out.logits, tokens)
