"""The middlebox: the compute-in-transit module on the hand-off link (see app.py)."""

from .app import Middlebox
from .stages import KernelConfig

__all__ = ["KernelConfig", "Middlebox"]
