"""Lab 05's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 5.1: the roofline time
RT_SPEC = "roofline_seconds(r, c) returns a float: the largest of the compute, memory and random terms"
RT_MAX = ("take the largest term (max), not their sum: an op's resources work at the same time, and the slowest "
          "one sets its time")
RT_MEMORY = ("the memory term is the bytes the op moves over the bandwidth ceiling: every byte read and written "
             "crosses the bus")
RT_COMPUTE = "the compute term is compute_seconds(r, c), given: FLOPs over the peak, or exp over the exp rate"
RT_RANDOM = ("the random term is random_draws(r) / c.random_rate for an op that draws, and 0 when c.random_rate "
             "is None (a spec sheet states no such limit)")
RT_VIEW = "an op that moves no data (not moves_data(r): a view) costs 0"
RT_DRAM = ("the memory term is over c.peak_bandwidth, main memory's: c.bandwidths (and c.hot, c.bandwidth_at) are a "
           "copy replayed at smaller footprints, from cache, which a recomputation inside a real step does not meet")
RT_LAUNCH = ("the roofline time has no launch term: the launch floor (c.launch_seconds) is applied once, outside it, "
             "by whoever predicts a replay (max of the roofline time and one launch); inside it, it counts twice")
RT_IN_PLACE = ("an in-place op moves data (moves_data(r) is True: it reads and writes its input's storage) although it "
               "makes no output of its own: only an op that moves no data, a view, is free")
RT_RANDOM_OPS = ("every op that draws is random (r.random; random_draws(r) counts its draws), not only native_dropout: "
                 "nn.Dropout on a CPU draws with bernoulli_, in place")

# ---------------------------------------------------------------- Exercise 5.2: price
PRICE_SPEC = "price(ops, seconds_of) returns a list of OpRecords, one per op, in the same order"
PRICE_SECONDS = "each record's seconds must be seconds_of(that record); every other field unchanged"
PRICE_TIMED = ("replace the seconds of every record, also of one the stopwatch timed (seconds not None): the cost "
               "model's price is the point, and a record that keeps its measured seconds is priced by the stopwatch")
PRICE_ORIGINALS = ("leave the originals as they were: make a new record for each (dataclasses.replace copies one "
                   "with a field changed); records are frozen, and setting attributes through object.__setattr__ "
                   "changes the caller's")
