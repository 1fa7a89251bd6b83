"""Type aliases of the public API (annotations only: nothing here runs)."""

from __future__ import annotations

from typing import Any, TypeAlias

# A contiguous numpy.ndarray or CPU torch.Tensor, updated in place by the collectives. Any,
# because the core never imports torch (pyproject's import contracts) and the two types share
# no protocol worth stating.
Buffer: TypeAlias = Any
