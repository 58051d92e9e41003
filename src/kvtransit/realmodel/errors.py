"""The one error type of the real-model layer: bad input or a missing piece, said in one line."""

from __future__ import annotations


class RealModelError(ValueError):
    """The extra is missing, the model file does not load, or a context/window does not fit: one line, exit 2."""
