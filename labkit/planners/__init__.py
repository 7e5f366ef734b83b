"""Measure a model, then decide how to checkpoint it: the advisor (advice.py) and lab 07's profile of a model's
blocks (profiling.py) and a plan run for real (applying.py), on one measuring core (measuring.py). The only
part of the kit besides the checkers and benchmarks that runs a lab's code, through labkit.labs."""
from labkit.planners.advice import Advice, advise, decide, scheme, situation
from labkit.planners.applying import applied, largest_batch, measure_step
from labkit.planners.profiling import profile_model
from labkit.planners import persistent  # lab 03's schedules: lk.planners.persistent, as the lab names it
from labkit.planners import solver  # lab 04's knapsack as compile's solver: lk.planners.solver (light to import)

__all__ = ["Advice", "advise", "decide", "scheme", "situation", "applied", "largest_batch", "measure_step",
           "profile_model", "persistent", "solver"]
