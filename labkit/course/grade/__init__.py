"""`python -m labkit grade SUBMISSIONS...`: grade a class of returned notebooks without trusting them.

Each returned file (files.py: regular files only) is matched to its lab, its answer cells taken by cell id
(rebuild.py) and scanned; the lab's `#| export` cells, the answers cut to their definitions, make the program a
box runs (sandbox.py, worker.py). A judge process per job slot (judge.py) runs the box and decides each exercise:
where the checker only calls the student's functions on data, it runs in the judge, outside the box, on cases
drawn afresh from the run's seed besides the public ones; where it must share a process with the student's
objects, it runs in the box, after the guard (guard.py) and before nothing else of the student's. One row per
student and exercise (report.py): passed, failed, not attempted, timeout, error, missing or tampered.

A class split across machines is graded in parts, chosen by the students' names, and joined (shards.py); lab
07's planners are raced in their boxes and ranked (leaderboard.py).

The run itself is grader.py (``run(Options) -> Gradebook``, options.py); what its processes say to each other,
messages.py. This package's own module imports nothing: the box imports guard.py, messages.py and wire.py from it,
and should not pay for what only the grader's side needs (nbformat alone costs a box a second).
"""
