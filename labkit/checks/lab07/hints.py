"""Lab 07's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 7.1: the planner
PLAN_SPEC = ("plan_blocks(profile, budget) returns a list of labkit.plans.Step covering blocks 0..n in order, "
             "or None when no plan's peak_of fits the budget")
PLAN_NONE = ("return None when nothing fits: below profile.floor or profile.base (test both: a budget can sit "
             "between the two), or when even the leanest plan's peak_of is over the budget")
PLAN_ZERO = ("budget=0 is a budget like any other, one nothing fits (it is below every base and floor, or every "
             "block keeps a byte): return None there. Refusing a budget that is not a positive int is plan_for's "
             "job (check_budget, given), not the planner's")
PLAN_FITS = ("the plan you return must fit: peak_of(plan, profile) <= budget. Everything kept plus base fits; and a "
             "step's backward needs, beside what the steps before it keep, its `held` bytes plus the block's "
             "`beside` (a segment: the most of act[i] + ... + act[k] + beside[k] over its blocks k)")
PLAN_MISSED = ("you returned None, yet a plan fits: your search misses it, or counts more than the spec's rooms. A "
               "plan at exactly the budget fits (<=); base is in the room for what the blocks keep, not in a "
               "backward's; a segment needs the running maximum over its blocks; and a segment of several blocks, "
               "or a block's other ways, can be the only plan that fits")
PLAN_STRICT = ("your plan is the best one for a budget one byte smaller: a plan whose peak is exactly the budget "
               "fits too (at most `budget`, <=)")
PLAN_OPTIMAL = ("the plan fits but is slower than the best one: from every reachable (i, m) try each way of block "
                "i and every segment [i, j), keeping the least seconds for each number of kept units")
PLAN_UNITS = ("count bytes in the unit _units(profile, most) gives for the `most` you were passed (4096 unless "
              "one is given): the common divisor of the byte counts, or total / most only when the profile is "
              "too large for `most` units. In a coarser unit or a finer one the rooms differ, and so does the plan")
PLAN_TIE = ("two plans tie on the least seconds, and yours keeps more units than the other: on a tie the spec "
            "takes the smallest m of best[n, m]")
PLAN_COVER = ("the steps must cover the blocks in order, Step(0, ..) first, each starting where the last stopped; "
              "a way other than \"recompute\" covers exactly one block, and that block must have it")
PLAN_MUTATES = "plan_blocks must not change the profile it is given (it is frozen: build new lists instead)"
PLAN_SLOW = ("plan_blocks took too long on 200 blocks: let numpy do every kept amount m of a row at once (and every "
             "segment end j), looping in Python only over blocks and ways")
