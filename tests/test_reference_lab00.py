"""Lab 00's reference code (labkit.reference.start_here.tensor_bytes) against PyTorch's own storage sizes.

For a fresh contiguous tensor, tensor_bytes must equal ``t.untyped_storage().nbytes()``; for slices and permuted
views of a drawn tensor it must equal the storage of a fresh contiguous copy (and shape × a hard-coded table of
element sizes), while the storage the view shares is larger whenever the view has fewer elements than its base.
Shapes, dtypes and slices are drawn by Hypothesis.
"""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings, strategies as st

import labkit.reference.start_here as R

# bytes per element, written down rather than asked of torch (element_size() is what the reference uses)
ITEMSIZE = {torch.float16: 2, torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.int8: 1,
            torch.int32: 4, torch.int64: 8, torch.bool: 1, torch.complex64: 8}
dtypes = st.sampled_from(list(ITEMSIZE))
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, dtype=dtypes)
def test_a_fresh_tensor_is_its_storage(shape, dtype):
    t = torch.zeros(shape, dtype=dtype)
    got = R.tensor_bytes(t)
    assert type(got) is int
    assert got == t.untyped_storage().nbytes() == math.prod(shape) * ITEMSIZE[dtype]


@st.composite
def sliced(draw):
    """A tensor of drawn shape and dtype, a slice per dimension of it, and the slices' lengths."""
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    slices, lengths = [], []
    for n in shape:
        start, stop = draw(st.integers(0, n)), draw(st.integers(0, n))
        sl = slice(start, stop, draw(st.integers(1, 3)))
        slices.append(sl)
        lengths.append(len(range(n)[sl]))
    return torch.ones(shape, dtype=draw(dtypes)), tuple(slices), lengths


@settings(max_examples=80, deadline=None)
@given(case=sliced())
def test_a_slice_counts_its_elements_not_the_storage_it_shares(case):
    base, slices, lengths = case
    view = base[slices]
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()  # a view, not a copy
    want = math.prod(lengths) * ITEMSIZE[base.dtype]
    assert R.tensor_bytes(view) == want
    assert R.tensor_bytes(view) == view.clone(memory_format=torch.contiguous_format).untyped_storage().nbytes()
    if math.prod(lengths) < base.numel():
        assert view.untyped_storage().nbytes() > R.tensor_bytes(view)
    assert R.tensor_bytes(base) == base.untyped_storage().nbytes()  # the base itself is unchanged


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), dtype=dtypes, data=st.data())
def test_a_permuted_or_reshaped_view_has_the_bytes_of_its_base(shape, dtype, data):
    base = torch.zeros(shape, dtype=dtype)
    order = data.draw(st.permutations(range(len(shape))))
    for view in (base.permute(*order), base.reshape(-1), base.unsqueeze(0), base.mT):
        assert R.tensor_bytes(view) == base.untyped_storage().nbytes() == math.prod(shape) * ITEMSIZE[dtype]


def test_a_row_of_a_big_matrix_and_a_scalar():
    big = torch.zeros(1000, 10, dtype=torch.float64)
    assert R.tensor_bytes(big[3]) == 10 * 8 and big[3].untyped_storage().nbytes() == 80_000
    assert R.tensor_bytes(big[3, 4]) == 8  # a 0-d view: one element
    assert R.tensor_bytes(torch.tensor(1.5, dtype=torch.float16)) == 2
