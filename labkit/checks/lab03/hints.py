"""Lab 03's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 3.1: segments
SEG_SPEC = ("checkpoint_segments cuts the chain into `segments` consecutive pieces, as its docstring says, and "
            "runs each in order under the checkpoint passed in (run_layers makes one function of a piece)")
SEG_BOUNDS = ("the segments must start where the docstring's bounds put them, lengths differing by at most one "
              "layer: compute every bound from the segment's index, not as a multiple of one fixed length")
SEG_LAST = ("checkpoint every segment, the last one too (unlike torch's checkpoint_sequential): the rule of "
            "this lab, so that the memory model has no special case")
SEG_ARG = "use the checkpoint function passed in (the `checkpoint` argument), not a fixed one"
SEG_ONCE = ("run each layer once in forward and once more in its segment's recompute: every layer belongs to "
            "exactly one segment")
SEG_EXACT = "gradients must equal the plain chain's bit for bit: run the layers in order, unchanged"
SEG_BAD_K = ("refuse segments outside 1..n (and non-ints) with a ValueError that names the value and the allowed "
             "range")
SEG_BAD_CHAIN = ("check the chain first (check_chain): an empty chain is a ValueError, an element that is not "
                 "callable a TypeError")

# ---------------------------------------------------------------- Exercise 3.2: the model
MODEL_SPEC = ("segment_peak is the text's peak(k): the kept segment inputs, the longest segment's activations "
              "while it is recomputed, and what backward holds besides")
MODEL_CEIL = ("the longest segment has ceil(n/k) layers, not n/k rounded down: -(-n // k) in integer "
              "arithmetic")
MODEL_EXTRA = "add extra_bytes: backward holds gradients and the rerun's output besides the saved activations"
MODEL_INPUTS = "k segments keep k inputs: segments * input_bytes"
MODEL_BEST = ("best_segments must search k = 1..n for the least segment_peak (the smallest k on a tie): √n is "
              "the answer only when input_bytes == layer_bytes")
MODEL_INT = "return Python ints (use // and -(-a // b), not / and math.ceil on floats)"

# ---------------------------------------------------------------- Exercise 3.3: recursion
REC_SPEC = ("checkpoint_recursive(layers, x, checkpoint): one layer runs plainly; otherwise checkpoint the first "
            "half with a function that runs checkpoint_recursive on it, then recurse on the second half")
REC_CALLS = ("each half must recurse: the function you checkpoint for the first half runs the recursion "
             "itself rather than the layers flat, and the second half recurses directly; the layer calls then "
             "follow T(n) = n//2 + T(n//2) + T(n - n//2)")
REC_SPLIT = ("your split gives an odd chain's extra layer to the first half: the exercise's text says where to "
             "split, rounding down, so the first half is the shorter one")
REC_ARG = "pass the checkpoint argument down the recursion and use it, not a fixed one"

# ---------------------------------------------------------------- Exercise 3.4: the planner
PLAN_SPEC = ("plan(costs, budget) returns a list of Segments covering layers 0..n in order, or None when no "
             "schedule's peak_of fits the budget")
PLAN_NONE = ("return None when nothing fits (every layer recomputed, in the best segments, is the least a "
             "schedule can need)")
PLAN_FITS = ("the schedule you return must fit: peak_of(schedule, costs) <= budget; count the kept input of "
             "each recomputed segment and costs.extra")
PLAN_OPTIMAL = ("the schedule fits but recomputes more than the best one: consider every segment end j for a "
                "recomputed segment starting at i, and storing layers too, keeping the least cost for each "
                "amount of kept memory")
PLAN_COVER = "the segments must cover the chain in order: Segment(0, ..), then each starting where the last stopped"

# ---------------------------------------------------------------- Exercise 3.5: the optimal persistent schedule
OPT_SPEC = ("optimal_tables(costs, u) fills the given tables and returns (best, how, start(0, n)) as the given code "
            "does; write only the two ways of each (s, e), as numpy rows over every m")
OPT_FITS = ("a way may be taken only where everything it has alive fits in m: T s (t[s]), B s after it (its output, "
            "its graph, the gradient arriving and b[s], and the loss at the chain's end), each F of the run "
            "(its input and f[j])")
OPT_OPTIMAL = ("the least cost is lower than yours: consider both ways at every (s, e) and every split s' between, "
               "and give each part the memory it has: m - tape[s] - x[s+1] after a tape, m - x[s'] for [s', e), "
               "m + freed - late - grad[s'] for [s, s') afterwards")
OPT_HOW = ("how[s, e, m] must say the way whose cost best keeps: 0 for a tape, the split s' for a forward run, "
           "-1 where nothing fits")
