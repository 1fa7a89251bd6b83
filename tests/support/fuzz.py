"""Hypothesis strategies for the fuzz tests: arbitrary msgpack-able values, nested a little,
as a peer gone bad (or a bug) might send them (tests/scenarios/test_security.py,
tests/unit/membership/test_verdicts.py)."""

from __future__ import annotations

from hypothesis import strategies as st

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=8,
)
