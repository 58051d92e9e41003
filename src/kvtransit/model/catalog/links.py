"""The links a KV hand-off can cross (docs/reference.md §2): bandwidth, latency, energy per bit."""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.errors import ConfigError, require_positive, unknown_name

GB = 1e9  # docs/reference.md §2: GB = 1e9 bytes
US = 1e-6
BITS_PER_BYTE = 8
PJ = 1e-12


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_Bps: float
    latency_s: float
    pj_per_bit: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a link needs a name")
        require_positive(f"link {self.name!r}: bandwidth_Bps", self.bandwidth_Bps)
        if not self.latency_s >= 0:
            raise ConfigError(f"link {self.name!r}: latency_s must be >= 0, got {self.latency_s!r}")
        if not self.pj_per_bit >= 0:
            raise ConfigError(f"link {self.name!r}: pj_per_bit must be >= 0, got {self.pj_per_bit!r}")

    def serialisation_s(self, nbytes: float) -> float:
        """How long `nbytes` occupy the link (what link busy sums, docs/reference.md §2)."""
        if nbytes < 0:
            raise ConfigError(f"bytes must be >= 0, got {nbytes!r}")
        return nbytes / self.bandwidth_Bps

    def transfer_time_s(self, nbytes: float) -> float:
        """latency + bytes / bandwidth (docs/reference.md §2)."""
        return self.latency_s + self.serialisation_s(nbytes)

    def energy_j(self, nbytes: float) -> float:
        """Wire bits × pJ per bit (docs/reference.md §5)."""
        if nbytes < 0:
            raise ConfigError(f"bytes must be >= 0, got {nbytes!r}")
        return nbytes * BITS_PER_BYTE * self.pj_per_bit * PJ


# docs/reference.md §2: bandwidth, latency, pJ/bit.
LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("nvlink4", 450 * GB, 5 * US, 5.0),
        # docs/reference.md §7, scale-up links (the TP group's): nvlink3 (A100) and nvlink5 (B200), 5 µs as nvlink4.
        # §7 gives no energy for them; nvlink4's 5 pJ/bit (§2) stands in, a documented assumption.
        Link("nvlink3", 300 * GB, 5 * US, 5.0),
        Link("nvlink5", 900 * GB, 5 * US, 5.0),
        Link("ib-ndr", 50 * GB, 10 * US, 15.0),
        Link("eth-100g", 12.5 * GB, 20 * US, 15.0),
        Link("eth-25g", 3.125 * GB, 20 * US, 15.0),
        Link("pcie5", 64 * GB, 5 * US, 6.0),
        Link("pcie4", 32 * GB, 5 * US, 6.0),
        # The module's line rate only: docs/reference.md §2 gives it no latency and no energy per bit (the
        # module's own 1 µs and 1 pJ/bit live in module.Module), so both are zero here.
        Link("qsfp56", 25 * GB, 0.0, 0.0),
    )
}

def link_by_name(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise unknown_name("link", name, LINKS) from None
