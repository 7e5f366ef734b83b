"""Checkers of 01_activation_memory.

Every checker holds the student's answer against a measurement, not only a
formula: labkit's saved-tensor ledger for what autograd keeps (1.1, 1.2, 1.5)
and a real Adam step for the training state (1.3, 1.4). Gradients are compared
bit for bit (torch.equal), never with a tolerance. When an answer is
wrong, the checker compares it with the values that common mistakes give and
picks the hint of the one it matches (`common.pick_hint`).

  hints.py   one hint per mistake      common.py  calling student code, picking a hint
  chain.py   1.1    block.py  1.2      state.py   1.3, 1.4    hooks.py  1.5
"""
from labkit.checks.lab01.block import BLOCK_CASES, BLOCK_MODULES, ex_1_2, measured_block_bytes
from labkit.checks.lab01.chain import ex_1_1
from labkit.checks.lab01.hooks import ex_1_5
from labkit.checks.lab01.state import ex_1_3, ex_1_4

__all__ = ["ex_1_1", "ex_1_2", "ex_1_3", "ex_1_4", "ex_1_5", "BLOCK_CASES", "BLOCK_MODULES", "measured_block_bytes"]
