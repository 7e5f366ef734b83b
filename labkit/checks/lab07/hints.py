"""Lab 07's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 7.1: the planner
PLAN_SPEC = ("plan_blocks(profile, budget) returns a list of labkit.plans.Step covering blocks 0..n in order, "
             "or None when no plan's peak_of fits the budget")
PLAN_NONE = ("return None when nothing fits: below profile.floor or profile.base, or when even the leanest plan's "
             "peak_of is over the budget")
PLAN_FITS = ("the plan you return must fit: peak_of(plan, profile) <= budget. Everything kept plus base fits; and a "
             "step's backward needs, beside what the steps before it keep, its `held` bytes plus the block's "
             "`beside` (a segment: the most of act[i] + ... + act[k] + beside[k] over its blocks k)")
PLAN_OPTIMAL = ("the plan fits but is slower than the best one: from every reachable (i, m) try each way of block "
                "i and every segment [i, j), keeping the least seconds for each number of kept units")
PLAN_COVER = ("the steps must cover the blocks in order, Step(0, ..) first, each starting where the last stopped; "
              "a way other than \"recompute\" covers exactly one block, and that block must have it")
PLAN_MUTATES = "plan_blocks must not change the profile it is given (it is frozen: build new lists instead)"
PLAN_SLOW = ("plan_blocks took too long on 200 blocks: let numpy do every kept amount m of a row at once (and every "
             "segment end j), looping in Python only over blocks and ways")
