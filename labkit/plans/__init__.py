"""What a decision is made of, and the arithmetic on it: a plan over a model's blocks (blocks.py) and the
advisor's situation (situation.py). Pure data and sums, no measuring: lab code builds on these types, and the
planners (labkit.planners) measure a model to fill them in."""
from labkit.plans.plan import (
    KEEP, OFFLOAD, RECOMPUTE, SCHEMES, SELECTIVE, BlockCosts, Option, Profile, Step, check_plan, describe, peak_of,
    scheme_plan, seconds_of, sqrt_n_segments, step_ratio,
)
from labkit.plans.situation import SchemeCost, Situation, check_budget

__all__ = ["KEEP", "OFFLOAD", "RECOMPUTE", "SCHEMES", "SELECTIVE", "BlockCosts", "Option", "Profile", "Step",
           "check_plan", "describe", "peak_of", "scheme_plan", "seconds_of", "sqrt_n_segments", "step_ratio",
           "SchemeCost", "Situation", "check_budget"]
