"""The middlebox's stage chain, one small stage per file (toxiproxy's toxics are the model).

kernel (codec on the bytes) → module (the optics' arithmetic budget, held on deadlines) → link (FIFO
channels, token bucket, delay line). Each stage has one job and says what it is (`describe()`); chain.py
registers the kinds by name and builds the chain from a declaration.
"""

from .base import Stage
from .chain import DEFAULT_CHAIN, STAGE_KINDS, ChainSettings, StageChain
from .kernel import ActiveKernel, KernelConfig, KernelStage
from .link import LINK_BACKENDS, LinkStage
from .module import ModuleStage

__all__ = ["DEFAULT_CHAIN", "LINK_BACKENDS", "STAGE_KINDS", "ActiveKernel", "ChainSettings", "KernelConfig",
           "KernelStage", "LinkStage", "ModuleStage", "Stage", "StageChain"]
