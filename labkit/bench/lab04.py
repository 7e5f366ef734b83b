"""Labs 04's benchmark: selective checkpointing policies on a long-sequence GPT stack."""
from __future__ import annotations

from labkit.models import GPTConfig
from labkit.profile import Sizes, sizes


def long_config(size: Sizes | None = None) -> GPTConfig:
    """The profile's long-sequence stack (labs 04-05): attention's (b, a, s, s) tensors dominate its activations."""
    size = size or sizes()
    return GPTConfig(seq=size.long_seq, batch=size.long_batch, hidden=size.long_hidden, heads=size.long_heads,
                     n_layers=size.long_layers, dropout=0.1)
