"""Exercise checkers, one module per lab; `lk.checks.ex_N_M` checks Exercise N.M.

A checker prints one line when it passes. Otherwise it raises a CheckFailure
(an AssertionError): `[ex 2.1] what was checked: expected X, got Y.` and one
hint; an exercise whose stub is still in place raises NotAttempted instead of
a traceback from deep inside the check. Each is wrapped by `checker` (base.py):
the failure shows its message and hint, not the checker's source, and in
JupyterLab it is printed rather than raised, so Run All reaches the end.
"""
from labkit.checks import lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07
from labkit.checks.base import CheckFailure, NotAttempted, attempt, checker, passed

ex_0_1 = checker(lab00.ex_0_1)
ex_1_1, ex_1_2, ex_1_3, ex_1_4, ex_1_5 = map(checker, (lab01.ex_1_1, lab01.ex_1_2, lab01.ex_1_3, lab01.ex_1_4,
                                                       lab01.ex_1_5))
ex_2_1, ex_2_2, ex_2_3, ex_2_4, ex_2_5 = map(checker, (lab02.ex_2_1, lab02.ex_2_2, lab02.ex_2_3, lab02.ex_2_4,
                                                       lab02.ex_2_5))
ex_3_1, ex_3_2, ex_3_3, ex_3_4, ex_3_5 = map(checker, (lab03.ex_3_1, lab03.ex_3_2, lab03.ex_3_3, lab03.ex_3_4,
                                                               lab03.ex_3_5))
ex_4_1, ex_4_2, ex_4_3 = map(checker, (lab04.ex_4_1, lab04.ex_4_2, lab04.ex_4_3))
ex_5_1, ex_5_2 = map(checker, (lab05.ex_5_1, lab05.ex_5_2))
ex_6_1, ex_6_2, ex_6_3 = map(checker, (lab06.ex_6_1, lab06.ex_6_2, lab06.ex_6_3))
ex_7_1 = checker(lab07.ex_7_1)

__all__ = ["CheckFailure", "NotAttempted", "attempt", "passed", "ex_0_1", "ex_1_1", "ex_1_2", "ex_1_3", "ex_1_4", "ex_1_5", "ex_2_1", "ex_2_2", "ex_2_3", "ex_2_4", "ex_2_5",
           "ex_3_1", "ex_3_2", "ex_3_3", "ex_3_4", "ex_3_5", "ex_4_1", "ex_4_2", "ex_4_3",
           "ex_5_1", "ex_5_2", "ex_6_1", "ex_6_2", "ex_6_3", "ex_7_1"]
