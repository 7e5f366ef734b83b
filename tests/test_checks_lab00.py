"""Tests for the checker of 00_start_here: it catches each planted bug with its own hint (the contract, that the
reference passes and a stub is not attempted, is tests/test_checks_contract.py's)."""
from __future__ import annotations

import pytest

from labkit import checks
from labkit.checks import CheckFailure, NotAttempted
from labkit.checks import lab00 as H


@pytest.mark.parametrize("bug, hint", [
    (lambda t: t.numel() * 4, H.COUNT),  # float32 only
    (lambda t: t.numel(), H.COUNT),
    (lambda t: t.element_size(), H.COUNT),
    (lambda t: t.untyped_storage().nbytes(), H.VIEW),  # a view's storage is its base's
    (lambda t: float(t.numel() * t.element_size()), H.INT),
    (lambda t: str(t.numel() * t.element_size()), H.INT),
], ids=["float32-size", "numel", "element-size", "storage", "float", "str"])
def test_ex_0_1_catches(bug, hint):
    with pytest.raises(CheckFailure) as info:
        checks.ex_0_1(bug)
    assert not isinstance(info.value, NotAttempted)
    assert info.value.hint == hint, info.value
