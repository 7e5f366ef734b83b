"""Checkers of 07_capstone: the planner, against exhaustive search over every plan of small profiles.

  hints.py  one hint per mistake   oracle.py  every plan, priced (brute force)   planner.py  7.1
"""
from labkit.checks.lab07.planner import ex_7_1

__all__ = ["ex_7_1"]
