"""Checkers of 03_sqrt_n: segments, their memory model, the recursion, the planner.

Segments and recursion run on small chains whose layers widen (2, 3, 4, ...
features), so the width of a kept tensor says which layer it feeds: the
checks read where segments start, count each layer's forward calls and
compare gradients bit for bit with the plain chain. The planner is held
against exhaustive search on short chains (whole units of several bytes
among them, budgets a byte under each peak); the model against its formula.
A schedule that does not fit is named by the op that first goes over.

  hints.py  one hint per mistake   common.py  the chain, calling student code
  segments.py  3.1, 3.2   recursive.py  3.3   planner.py  3.4   optimal.py  3.5 (the base case row by row, then
  exhaustive search over every persistent schedule, simulated by the checker's own code)
"""
from labkit.checks.lab03.optimal import ex_3_5
from labkit.checks.lab03.planner import ex_3_4
from labkit.checks.lab03.recursive import ex_3_3
from labkit.checks.lab03.segments import ex_3_1, ex_3_2

__all__ = ["ex_3_1", "ex_3_2", "ex_3_3", "ex_3_4", "ex_3_5"]
