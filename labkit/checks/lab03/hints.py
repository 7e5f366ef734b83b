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
SEG_BAD_K = "refuse an int segments outside 1..n with a ValueError that names the value and the allowed range"
SEG_BAD_TYPE = ("refuse a segments that is not an int with a TypeError naming the value (a wrong type; ValueError is "
                "for an int out of range): 2.0 and \"2\" are not ints, and neither is True here, though Python "
                "counts a bool as one")
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
PLAN_MISSED = ("plan returned None, but a schedule fits: every state the dynamic program can reach must be kept "
               "(store layer i, or recompute [i, j) for each j, whenever what they have alive fits the budget in "
               "units), and the answer is the least cost at the chain's end over every amount kept")
PLAN_FITS = ("the schedule you return must fit: peak_of(schedule, costs) <= budget; count the kept input of "
             "each recomputed segment and costs.extra")
PLAN_OPTIMAL = ("the schedule fits but recomputes more than the best one: consider every segment end j for a "
                "recomputed segment starting at i, and storing layers too, keeping the least cost for each "
                "amount of kept memory")
PLAN_ROUND = ("the schedule needs more than the budget, by less than one unit: the budget in units must be rounded "
              "down (a schedule that fits in units must fit in bytes), while what is kept is rounded up")
PLAN_COVER = "the segments must cover the chain in order: Segment(0, ..), then each starting where the last stopped"

# ---------------------------------------------------------------- Exercise 3.5: the optimal persistent schedule
OPT_SPEC = ("optimal_tables(costs, u) fills the given tables and returns (best, how, start(0, n)) as the given code "
            "does; write only the two ways of each (s, e), as numpy rows over every m")
OPT_FITS_T = ("T s fits only where m holds what it reaches above what is alive, t[s]: test it before a tape")
OPT_FITS_B = ("B s fits only where m holds, after [s+1, e) is done, everything it has alive: its output x[s+1], its "
              "graph tape[s], the gradient arriving (grad[s+1], less what the end of [s, e) let go), what it reaches, "
              "b[s], and the loss at the chain's end (late)")
OPT_FITS_F = ("each F j of a forward run from s fits only where m holds its input x[j] (for every F after the first: "
              "x[s] is the one m leaves out) and what it reaches above it, f[j]; the largest of these moments "
              "over the run must fit")
OPT_BASE_FITS = ("the base case: C(s, s+1, m) is finite exactly where T s fits (m >= t[s]) and B s fits after it "
                 "(its output x[s+1], its graph tape[s] and b[s], and the loss when s is the chain's last layer); "
                 "the gradient of x[s+1] is already counted outside m")
OPT_BASE_COST = "the base case: C(s, s+1, m) costs layer s's one taped forward, fwd[s], wherever it fits"
OPT_LATE = ("the loss and its gradient exist from the first backward on: a part ending at the chain's end (e == n) "
            "has them alive in every B, the base case's too (late)")
OPT_OPTIMAL = ("the least cost is lower than yours: consider both ways at every (s, e) and every split s' between, "
               "each wherever what it has alive fits, and keep the cheaper")
OPT_SHIFTS = ("your best at some (s, e, m) is no way's cost from the rows of its parts: give each part the memory it "
              "has: m - tape[s] - x[s+1] after a tape, m - x[s'] for [s', e), m + freed - late - grad[s'] for "
              "[s, s') afterwards")
OPT_HOW = ("how[s, e, m] must say the way whose cost best keeps: 0 for a tape, the split s' for a forward run, "
           "-1 where nothing fits")
