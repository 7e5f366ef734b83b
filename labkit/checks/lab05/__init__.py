"""Checkers of 05_roofline: the roofline time of an op, and pricing a policy's ops by a cost model.

roofline_seconds is held against the checkers' own roofline time (oracle.py) on a traced GPT block and on
made-up records chosen so that each term (compute, memory, random) is the largest in turn; price against its
definition, with the originals checked unchanged.

  hints.py  one hint per mistake   oracle.py  the checkers' roofline time   roofline.py  5.1, 5.2
"""
from labkit.checks.lab05.roofline import ex_5_1, ex_5_2

__all__ = ["ex_5_1", "ex_5_2"]
