"""The middlebox's stage chain, one small stage per file (toxiproxy's toxics are the model).

kernel (codec on the bytes) → module (the optics' arithmetic budget, held on deadlines) → link (FIFO
channels, token bucket, delay line). Each stage has one job and says what it is (`describe()`).
"""

from .kernel import KernelConfig, KernelStage
from .link import LinkStage
from .module import ModuleStage

__all__ = ["KernelConfig", "KernelStage", "LinkStage", "ModuleStage"]
