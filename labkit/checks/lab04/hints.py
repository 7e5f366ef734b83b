"""Lab 04's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 4.1: the selective checkpoint
SEL_SPEC = ("checkpoint_selective(fn, *args, keep=...) returns fn's output: checkpoint_hooks over a function that "
            "runs fn under KeepOutputs the first time and under ReplayOutputs after")
SEL_GRADS = ("gradients must equal no checkpointing bit for bit: in ReplayOutputs return the kept outputs "
             "(tree_unflatten of the stored leaves) for kept ops and run every other op unchanged")
SEL_BYTES = ("keep exactly the outputs of the ops in keep, one detached alias each, and count calls per op name "
             "with next_key in both modes, so a key names the same op as in PyTorch's policy")
SEL_SKIP = ("the recomputation must not run a kept op: return its stored outputs instead of calling func")
SEL_MUTATED = ("store t._version with each kept tensor and compare it in ReplayOutputs: a kept output changed in "
               "place must be refused with CheckpointError and the lab's MUTATED message")
SEL_ALIAS = ("your kept tensor did not see the in-place change: a plain t.detach() inside a dispatch mode gets a "
             "version counter of its own (autograd's ADInplaceOrView key is off down there), so its _version never "
             "moves; keep alias(t), given, which shares t's counter")
SEL_RANDOM = ("in KeepOutputs, remember the first kept random op (is_random(func)); a later random op that is "
              "not kept must be refused in forward with CheckpointError and the lab's RANDOM_ORDER message, naming "
              "both ops")
SEL_TWICE = ("pop each kept entry in ReplayOutputs (memory is freed as backward goes); a kept op with no entry "
             "left is a second backward: refuse it with CheckpointError and the lab's TWICE message")

# ---------------------------------------------------------------- Exercise 4.2: greedy
GREEDY_SPEC = "greedy_keep(ops, budget) returns a frozenset of the keys of the candidates it keeps"
GREEDY_ORDER = ("drop candidates in order of keep_bytes(r) / r.seconds, largest first (ties: the earlier op first), "
                "and stop as soon as kept_bytes fits the budget")
GREEDY_TIES = ("two candidates with the same bytes per second: drop the earlier one first (a stable sort keeps ties in "
               "their order; reversing a sorted list, or sorting by the negated index, puts the later one first)")
GREEDY_RANDOM = ("when you drop a random op, drop every random op before it too: recomputed random ops must come "
                 "before kept ones (random_ok)")
GREEDY_CANDIDATES = ("consider only candidates(ops): no views, no ops without an output of their own or whose "
                     "output a later op changes in place")
BUDGET_CHECK = "start with check_budget(budget, ...): a negative budget is a ValueError, a non-int a TypeError"

# ---------------------------------------------------------------- Exercise 4.3: knapsack
KNAP_SPEC = "knapsack_keep(ops, budget) returns a frozenset of the keys of the candidates it keeps"
KNAP_FITS = ("kept_bytes must fit the budget (keep_bytes: the block's output is free): in units, round each "
             "op's weight up and the capacity down, never the other way, so a set that fits in units fits in bytes")
KNAP_OPTIMAL = ("the set fits but keeps fewer seconds than the best one: a 0/1 knapsack weighs, for every "
                "candidate and every capacity, leaving it out against taking it (each candidate at most once: "
                "capacities from high to low), then reads the choices back")
KNAP_MOST = ("the set keeps more seconds than the knapsack in units allows: when the budget would need more than "
             "`most` units, count bytes in units of ceil(budget / most) (rounded up per op), not in finer ones: `most` "
             "caps the table's size, which in bytes can be millions of cells per op")
KNAP_RANDOM = ("the kept random ops must be a suffix of them (random_ok): try each suffix, charge it to the "
               "budget, and fill the rest with the other candidates")
KNAP_CANDIDATES = ("choose among candidates(ops) only: no views, no ops without an output of their own or whose "
                   "output a later op changes in place")
