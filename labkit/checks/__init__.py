"""Exercise checkers, one module per lab; `lk.checks.ex_N_M` checks Exercise N.M.

A checker prints one line when it passes. Otherwise it raises a CheckFailure
(an AssertionError): `[ex 2.1] what was checked: expected X, got Y.` and one
hint; an exercise whose stub is still in place raises NotAttempted instead of
a traceback from deep inside the check.
"""
from labkit.checks.base import CheckFailure, NotAttempted, attempt, passed
from labkit.checks.lab00 import ex_0_1
from labkit.checks.lab01 import ex_1_1, ex_1_2, ex_1_3, ex_1_4, ex_1_5
from labkit.checks.lab02 import ex_2_1, ex_2_2, ex_2_3, ex_2_4, ex_2_5
from labkit.checks.lab03 import ex_3_1, ex_3_2, ex_3_3, ex_3_4
from labkit.checks.lab04 import ex_4_1, ex_4_2, ex_4_3
from labkit.checks.lab05 import ex_5_1, ex_5_2

__all__ = ["CheckFailure", "NotAttempted", "attempt", "passed", "ex_0_1", "ex_1_1", "ex_1_2", "ex_1_3", "ex_1_4", "ex_1_5", "ex_2_1", "ex_2_2", "ex_2_3", "ex_2_4", "ex_2_5",
           "ex_3_1", "ex_3_2", "ex_3_3", "ex_3_4", "ex_4_1", "ex_4_2", "ex_4_3",
           "ex_5_1", "ex_5_2"]
