"""Checkers of 02_recompute: Recompute, RNG and autocast replay, checkpoint, checkpoint_hooks.

Every check runs one small training step twice, plainly and through the
student's code, from the same weights and seeds, and compares the gradients
bit for bit (recomputation reruns the very same ops, so equality is exact).
Recomputation is proven by counting: calls of fn, grad mode in each call,
bytes saved (the Ledger) or kept alive (weak references) after forward and
during backward. The checks run inside `torch.random.fork_rng`, so the
notebook's generator is left as it was. A check whose exercise builds on an
earlier one says "make Exercise N.M pass first" when that one is the cause.

  rig.py          the net, the plain step, comparisons, censuses
  hints.py        one hint per mistake
  common.py       calling student code, prerequisites
  recompute.py    2.1    replay.py  2.2, 2.3    checkpoint.py  2.4    hooks.py  2.5
"""
from labkit.checks.lab02.checkpoint import ex_2_4
from labkit.checks.lab02.hooks import ex_2_5
from labkit.checks.lab02.recompute import ex_2_1
from labkit.checks.lab02.replay import ex_2_2, ex_2_3

__all__ = ["ex_2_1", "ex_2_2", "ex_2_3", "ex_2_4", "ex_2_5"]
