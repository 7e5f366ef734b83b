"""The instruments: what autograd saves (ledger), live tensor bytes over time (meter), the stopwatch (timing) and
the device it times on (devices), every op of a forward (ops), a step compared with another (harness), a model's
blocks run another way (blocks), and the machine's ceilings (roofline).

The names a lab's code imports most are here as well: `from labkit.instruments import saved_tensors`.
"""
from labkit.instruments.ledger import Ledger, LedgerTable, SavedTensor, saved_tensors
from labkit.instruments.meter import Event, MemoryMeter, measure_peak
from labkit.instruments.ops import OpRecord, is_random, op_key, trace
from labkit.instruments.tensors import op_name

__all__ = ["Event", "Ledger", "LedgerTable", "MemoryMeter", "OpRecord", "SavedTensor", "is_random", "measure_peak",
           "op_key", "op_name", "saved_tensors", "trace"]
