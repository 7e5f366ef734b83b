"""labkit: the helper package behind the activation-checkpointing labs.

Notebooks use it as ``import labkit as lk``; this file is that surface.
"""
from labkit import checks
from labkit.profile import PROFILES, Sizes, profile, sizes

__all__ = ["PROFILES", "Sizes", "checks", "profile", "sizes"]
