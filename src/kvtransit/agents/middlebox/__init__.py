"""The middlebox: the compute-in-transit module on the hand-off link (see app.py)."""

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.stages import KernelConfig

__all__ = ["KernelConfig", "Middlebox"]
