"""Models the labs checkpoint, and the analytic activation-memory model.

- ``MLPChain``, ``layer_chain`` (mlp.py): chains of layers, equal or not (labs 01-03);
- ``GPTBlock`` / ``GPTStack`` / ``GPT`` (gpt.py): a transformer layer in the Megatron-LM layout, a stack of
  them, a whole language model (lab 07);
- ``ConvNet`` (convnet.py): a small CNN with BatchNorm (lab 06);
- ``korthikanti_terms`` / ``korthikanti_bytes`` (formula.py): that paper's formula, term by term.
"""
from labkit.models.convnet import ConvNet
from labkit.models.formula import ActivationTerm, korthikanti_bytes, korthikanti_terms
from labkit.models.gpt import (
    GPT, MLP, CoreAttention, Dropout, GPTBlock, GPTConfig, GPTStack, SelfAttention, gpt_input, gpt_param_count,
    gpt_tokens, next_token_loss,
)
from labkit.models.layers import parameter_bytes
from labkit.models.mlp import ChainLayer, MLPChain, MLPConfig, layer_chain, mlp_input

__all__ = [
    "MLPConfig", "MLPChain", "mlp_input", "ChainLayer", "layer_chain",
    "ConvNet", "GPTConfig", "Dropout", "CoreAttention", "SelfAttention", "MLP", "GPTBlock", "GPTStack", "gpt_input",
    "GPT", "gpt_tokens", "next_token_loss",
    "ActivationTerm", "korthikanti_terms", "korthikanti_bytes", "parameter_bytes", "gpt_param_count",
]
