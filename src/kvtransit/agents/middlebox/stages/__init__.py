"""The middlebox's stage chain, one small stage per file (toxiproxy's toxics are the model).

kernel (codec on the bytes) → module (the optics' arithmetic budget, held on deadlines) → link (FIFO
channels, token bucket, delay line). Each stage has one job and says what it is (`describe()`); chain.py
registers the kinds by name and builds the chain from a declaration.
"""

from kvtransit.agents.middlebox.stages.base import Stage
from kvtransit.agents.middlebox.stages.chain import DEFAULT_CHAIN, STAGE_KINDS, ChainSettings, StageChain
from kvtransit.agents.middlebox.stages.kernel import ActiveKernel, KernelConfig, KernelStage
from kvtransit.agents.middlebox.stages.link import LINK_BACKENDS, LinkStage
from kvtransit.agents.middlebox.stages.module import ModuleStage

__all__ = ["DEFAULT_CHAIN", "LINK_BACKENDS", "STAGE_KINDS", "ActiveKernel", "ChainSettings", "KernelConfig",
           "KernelStage", "LinkStage", "ModuleStage", "Stage", "StageChain"]
