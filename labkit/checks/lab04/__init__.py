"""Checkers of 04_selective: a selective checkpoint from dispatch modes, and two planners under a budget.

The checkpoint runs on a small GPT block with dropout, held bit for bit against no checkpointing and byte
for byte against PyTorch's selective checkpoint with the same keys; a counting dispatch mode outside it
sees which ops the recomputation runs. The planners run on made-up op profiles, against the checker's own
greedy and against exhaustive search.

  hints.py  one hint per mistake   common.py  the block, profiles, calling student code
  checkpoint.py  4.1   planners.py  4.2, 4.3
"""
from labkit.checks.lab04.checkpoint import ex_4_1
from labkit.checks.lab04.planners import ex_4_2, ex_4_3

__all__ = ["ex_4_1", "ex_4_2", "ex_4_3"]
