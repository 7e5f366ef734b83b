"""labkit: the helper package behind the activation-checkpointing labs.

Notebooks use it as ``import labkit as lk``; this file is that surface.
"""
from labkit import bench, checks, plots
from labkit.doctor import doctor
from labkit.memory import Ledger, MemoryMeter, measure_peak, saved_tensors
from labkit.models import (
    GPTConfig, GPTStack, GPTBlock, MLPChain, MLPConfig, gpt_input, korthikanti_bytes,
    korthikanti_terms, mlp_input, parameter_bytes,
)
from labkit.profile import PROFILES, Sizes, profile, sizes
from labkit.timing import benchmark, compare

__all__ = [
    "PROFILES", "Sizes", "bench", "checks", "plots", "doctor", "profile", "sizes", "benchmark", "compare",
    "Ledger", "MemoryMeter", "measure_peak", "saved_tensors",
    "GPTConfig", "GPTStack", "GPTBlock", "MLPChain", "MLPConfig", "gpt_input", "mlp_input",
    "korthikanti_bytes", "korthikanti_terms", "parameter_bytes",
]
