"""Memory measurement: the saved-tensor ledger and the live-memory meter.

One import for both halves; the code lives in ledger.py (what autograd saves)
and meter.py (live tensor bytes over time), one idea per file.
"""
from labkit.ledger import Ledger, LedgerTable, SavedTensor, saved_tensors
from labkit.meter import Event, MemoryMeter, measure_peak

__all__ = ["Event", "Ledger", "LedgerTable", "MemoryMeter", "SavedTensor", "measure_peak", "saved_tensors"]
