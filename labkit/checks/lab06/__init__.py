"""Checkers of 06_pitfalls: comparing two tensors bit for bit, BatchNorm updated once under recomputation,
and the decision rule of the checkpointing advisor.

difference is held against the checkers' own comparison (oracle.py) on cases chosen so that each shortcut (==,
allclose, no dtype check) fails one; batchnorm_once by the harness comparing with that oracle, under both of
PyTorch's checkpoints, over two steps, with BatchNorm1d and 2d; recommend against situations with known answers.

  hints.py  one hint per mistake   oracle.py  the checkers' comparison   difference.py  6.1   batchnorm.py  6.2
  decide.py  6.3
"""
from labkit.checks.lab06.batchnorm import ex_6_2
from labkit.checks.lab06.decide import ex_6_3
from labkit.checks.lab06.difference import ex_6_1

__all__ = ["ex_6_1", "ex_6_2", "ex_6_3"]
