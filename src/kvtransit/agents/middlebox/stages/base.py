"""What every stage is: a kind, a description, an optional chunk hook and an optional live change.

A stage has a kind (`name`: its key in the chain and in `GET /chain`), says what it is (`describe()`), may
work on each chunk (`process`), may change live (`reconfigure`: the control API's `PUT /kernel`, `PUT
/link`), and is built from the run's `ChainSettings` (`from_settings`). Stage kinds are registered by name in
chain.py, as faults are in faults/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.model.errors import ConfigError

if TYPE_CHECKING:
    from kvtransit.agents.middlebox.stages.chain import ChainSettings


class Stage:
    """The base every stage kind extends; its defaults are a stage that changes nothing."""

    name = "stage"

    @classmethod
    def from_settings(cls, settings: ChainSettings) -> Stage:
        raise NotImplementedError(f"stage kind {cls.name!r} cannot be built from settings")

    def describe(self) -> dict:
        return {"stage": self.name}

    async def process(self, item: ChunkInFlight, kernel) -> ChunkInFlight:
        """Work on one chunk. `kernel`: the ActiveKernel its stream started with."""
        return item

    def reconfigure(self, update: dict) -> None:
        """Apply a live change (fields type-checked by the control API). ConfigError (or KernelInputError) if
        refused, and then the stage is unchanged."""
        raise ConfigError(f"the {self.name} stage has no live settings")

    def close(self) -> None:
        """The middlebox is stopping: release what the stage holds (its worker threads)."""
