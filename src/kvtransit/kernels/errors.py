"""The one error type for bad input to a kernel (layout, sizes, parameters, non-finite values, headers)."""

from __future__ import annotations


class KernelInputError(ValueError):
    """A kernel was given input it cannot process honestly. The message names what was wrong and where."""
