"""Sweeps, as data: a grid of scenario overrides, the presets, and the goodput search's bisection.

- A **grid** is a base scenario (field → value) and axes (field → values); its points are the cross product,
  in axis order, with duplicates dropped: codec "none" runs nowhere, so "none at the GPU" is "none in
  transit" and is run once.
- A point's **key** names it by its overrides only (`link=eth-25g,codec=fp8,compress_at=gpu,rate=8.0`): the
  results file is resumed by key.
- **Goodput** is DistServe's per-instance goodput: the highest request rate whose SLO attainment is at least
  the target (0.9 by default). `bisect_goodput` brackets it between a rate that meets the target and one that
  does not, halving the bracket a bounded number of times; the function that measures attainment at a rate
  is passed in (a live run in `harness/studies/sweep/runner.py`, a formula in the unit tests).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvtransit.harness.studies.sweep.baselines import faster_link_or_error
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.kv_scale import auto_channels_and_dilation
from kvtransit.model.scenario import Scenario, scenario_fields
from kvtransit.model.scenario_text import FieldTextError, field_from_text

DEFAULT_GOODPUT_TARGET = 0.9  # DistServe's attainment target (Zhong et al., OSDI '24, §2.2: "90% SLO attainment")


def _field_types() -> dict[str, type]:
    return {f.name: str if f.name == "scale" else type(f.default) for f in scenario_fields()}


SCENARIO_TYPES = _field_types()


def parse_value(name: str, text: str) -> Any:
    """One grid value of scenario field `name`, typed as the field is (ConfigError naming the field): the same
    reader as the flags (`field_from_text`), so booleans, `none` and `auto` read as they do there."""
    if name not in SCENARIO_TYPES:
        raise ConfigError(f"grid: unknown scenario field {name!r} (choose from: {', '.join(SCENARIO_TYPES)})")
    try:
        return field_from_text(name, text)
    except FieldTextError as exc:
        raise ConfigError(f"grid: {name}: {exc.reason}") from None


def parse_axis(spec: str) -> tuple[str, list[Any]]:
    """`"rate=8,10,12"` → `("rate", [8.0, 10.0, 12.0])` (scenario field names, `-` or `_`)."""
    name, sep, values = spec.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not values.strip():
        raise ConfigError(f"grid: expected FIELD=V1,V2,... (e.g. rate=8,10,12), got {spec!r}")
    return name, [parse_value(name, v) for v in values.split(",")]


# Every key names these first (whether the grid varies them or not), so keys of different grids line up.
KEY_FIELDS = ("link", "codec", "compress_at", "rate")


# A point's scenario fields (name → value): values of any field's type.
Overrides = dict[str, Any]


def point_key(overrides: Overrides) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items())


def canonical_key(scenario: Scenario, axes: dict[str, list[Any]]) -> str:
    """`link=…,codec=…,compress_at=…,rate=…` then the grid's other axes, all read from the scenario."""
    names = [*KEY_FIELDS, *(n for n in axes if n not in KEY_FIELDS)]
    return point_key({n: getattr(scenario, n) for n in names})


def codec_label(codec: str, compress_at: str) -> str:
    """How a codec column is headed: `none`, `fp8@transit`, `freq-keep-k@gpu`."""
    return codec if codec == "none" else f"{codec}@{compress_at}"


@dataclass(frozen=True)
class Derived:
    """A grid value worked out from the point's other fields when the points are made, not when the grid is:
    a preset's base may be overridden by the user's flags (`kvtransit sweep --preset baselines --link
    eth-100g`), and a value that depends on the link (the next faster one, its emulation) must follow it. In an
    axis it reads the grid's base; in the base it reads the base with the point applied."""

    name: str  # how it prints (a key never shows it: points are resolved)
    rule: Callable[[Overrides], Any]

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _resolved(values: Overrides, against: Overrides) -> Overrides:
    return {n: (v.rule(against) if isinstance(v, Derived) else v) for n, v in values.items()}


@dataclass(frozen=True)
class Grid:
    base: Overrides = field(default_factory=dict)  # scenario fields every point shares
    axes: dict[str, list[Any]] = field(default_factory=dict)  # field → values, in the order they vary (last fastest)

    def __post_init__(self) -> None:
        for name in [*self.base, *self.axes]:
            if name not in SCENARIO_TYPES:
                raise ConfigError(f"grid: unknown scenario field {name!r} (choose from: {', '.join(SCENARIO_TYPES)})")
        for name, values in self.axes.items():
            if not values:
                raise ConfigError(f"grid: axis {name} has no values")

    def points(self) -> list[Overrides]:
        """Each point's overrides (base excluded), duplicates dropped, in grid order."""
        seen: set[str] = set()
        out: list[Overrides] = []
        names = list(self.axes)
        for combo in itertools.product(*(self.axes[n] for n in names)):
            point = _resolved(dict(zip(names, combo, strict=True)), self.base)
            codec = point.get("codec", self.base.get("codec"))
            if codec == "none" and "compress_at" in point:
                point["compress_at"] = "transit"  # nothing to compress: where is moot
            key = point_key(point)
            if key not in seen:
                seen.add(key)
                out.append(point)
        return out

    def scenario(self, point: Overrides) -> Scenario:
        merged = {**self.base, **point}
        return Scenario.build(**_resolved(merged, merged))


# --- presets (the deck's hand-off study) -----------------------------------------------------------------
# The deck's workload: Llama-3-8B, 1 H100 per instance, 1P1D, 2,048-token prompts cv 0.5, 256-token outputs
# cv 0.5, 800 requests, seed 1 (docs/reference.md §4 defaults).
DECK_WORKLOAD = dict(model="llama3-8b", device="h100", gpus=1, prefill=1, decode=1, prompt_mean=2048.0,
                     prompt_cv=0.5, output_mean=256.0, output_cv=0.5, requests=800, seed=1)
# Emulation for this 2-core host, measured (benchmarks/sweep.py; RESULTS.md "## Sweep"): 40-request runs on
# eth-25g stay faithful with the scaled link at ~20-40 MB/s of real bytes and not at 78 MB/s (scale 0.05,
# dilation 2); `scale="auto"` aims at HOST_BUDGET_BPS (200 MB/s), which this host cannot hold beside the
# agents. Each link gets the most KV channels that fit the budget at dilation 2, and more dilation where even
# one channel is too fast (nvlink4). A full 800-request point at 14 req/s (link 93 % busy) used to miss the prefill
# timer guard by ~1 point (3.8-4.2 % late vs 3 %) at any dilation; with the timers' wake-ups at real-time priority
# (runtime/wakeup_priority.py) it passes (docs/results/handoff-layerwise-25g, 2026-12-01).
PRESET_HOST_BUDGET_BPS = 40e6
PRESET_DILATION = 2.0


def preset_emulation(link: str, model: str = "llama3-8b") -> dict[str, float]:
    """`{"scale", "dilation"}` for `link` within PRESET_HOST_BUDGET_BPS (at least PRESET_DILATION)."""
    spec = model_by_name(model)
    channels, dilation = auto_channels_and_dilation(spec, link_by_name(link), PRESET_DILATION, PRESET_HOST_BUDGET_BPS)
    return {"scale": channels / spec.kv_dim, "dilation": dilation}


DECK_CODECS = ("none", "fp8", "freq-keep-k")
DECK_LINKS = ("nvlink4", "ib-ndr", "eth-100g", "eth-25g")
# fp8 needs rounding, which the module does not publish (docs/reference.md §5): in transit it runs on the host.
DECK_POLICY = {"policy": "host"}


def _link_grid(link: str, axes: dict[str, list[Any]], **base: Any) -> Grid:
    return Grid({**DECK_WORKLOAD, **DECK_POLICY, **preset_emulation(link), "link": link, **base}, axes)


PRESETS: dict[str, tuple[str, list[Grid]]] = {
    "handoff-25g": (
        ("the deck's hand-off study: loads 8/10/12/14 req/s x codecs none/fp8/freq-keep-k in transit and at the "
         "GPU, over eth-25g"),
        [_link_grid("eth-25g", {"rate": [8.0, 10.0, 12.0, 14.0], "codec": list(DECK_CODECS),
                                "compress_at": ["transit", "gpu"]})]),
    "links-8rps": (
        ("the deck's link comparison at 8 req/s: nvlink4, ib-ndr, eth-100g, eth-25g x codecs none/fp8/freq-keep-k "
         "in transit"),
        [_link_grid(link, {"codec": list(DECK_CODECS)}, rate=8.0, compress_at="transit") for link in DECK_LINKS]),
}
PRESETS["deck"] = ("both deck studies: handoff-25g then links-8rps",
                   PRESETS["handoff-25g"][1] + PRESETS["links-8rps"][1])
# Layer-wise streaming: the 25 GbE load study again with the KV handed off whole (the reference model) and layer-wise
# (each layer as its compute ends, overlapping the prefill): does a codec on the hand-off still matter once it overlaps?
# Layer-wise points run at LAYERWISE_PRESET_DILATION: at the preset's 2, a light band-keep layer-wise run reached 96.4 %
# of the link's rate (its link idles between layers, and the check then judges a few ms of each hand-off), and
# tests/integration/test_layerwise_live.py needed 3 beside a busy CPU; whole points stay at the preset's (faithful
# there). Dilation is emulation: results are in model time either way.
LAYERWISE_PRESET_DILATION = 3.0
PRESETS["handoff-layerwise-25g"] = (
    ("layer-wise streaming: loads 8/10/12/14 req/s x codecs none/freq-keep-k in transit x hand-off whole/layerwise, "
     "over eth-25g (layer-wise at dilation 3)"),
    [_link_grid("eth-25g", {"rate": [8.0, 10.0, 12.0, 14.0], "codec": ["none", "freq-keep-k"],
                            "handoff": ["whole"]}, compress_at="transit"),
     _link_grid("eth-25g", {"rate": [8.0, 10.0, 12.0, 14.0], "codec": ["none", "freq-keep-k"],
                            "handoff": ["layerwise"]}, compress_at="transit", dilation=LAYERWISE_PRESET_DILATION)])

# Baselines at equal power (harness/studies/sweep/baselines.py): the kernel in transit, the same codec at the
# GPU, and no codec on the next faster link, for the deck's workload on eth-25g with freq-keep-k at 8 req/s. The user's
# flags override the base (`--link eth-100g --codec fp8`): the faster link and every point's emulation are Derived, so
# they follow the link given (each at preset_emulation(its link); an explicit --scale wins).
NEXT_FASTER_LINK = Derived("next faster link", lambda base: faster_link_or_error(base["link"]))
PRESET_SCALE = Derived("preset scale", lambda f: preset_emulation(f["link"], f.get("model", "llama3-8b"))["scale"])
PRESET_DILATION_OF_LINK = Derived("preset dilation",
                                  lambda f: preset_emulation(f["link"], f.get("model", "llama3-8b"))["dilation"])


def _kernel_at(where: str) -> Derived:
    """compress_at `where`, refusing a base with codec none (`--codec none`): it has no kernel to compare."""
    def rule(base: Overrides) -> str:
        if base.get("codec") == "none":
            raise ConfigError("preset baselines: codec 'none' has no kernel to compare; give the codec the module "
                              "would run (e.g. --codec freq-keep-k)")
        return where
    return Derived(where, rule)


BASELINES_BASE = {**DECK_WORKLOAD, **DECK_POLICY, "link": "eth-25g", "codec": "freq-keep-k", "rate": 8.0,
                  "scale": PRESET_SCALE, "dilation": PRESET_DILATION_OF_LINK}
PRESETS["baselines"] = (
    ("baselines at equal power: freq-keep-k in transit, at the GPU, and codec none on the next faster link, "
     "eth-25g, 8 req/s (--link/--codec/--rate move all three)"),
    [Grid(dict(BASELINES_BASE), {"compress_at": [_kernel_at("transit"), _kernel_at("gpu")]}),
     Grid(dict(BASELINES_BASE),
          {"codec": ["none"], "compress_at": [_kernel_at("transit")], "link": [NEXT_FASTER_LINK]})])

def kernel_at(where: str) -> Derived:
    return _kernel_at(where)


def presets() -> dict[str, tuple[str, list[Grid]]]:
    """Every preset: the core's (the hand-off's studies) and each flow's (a flow's `presets.py`: PRESETS, reached
    through the registry; the tier's `kvpool` and `tier-deck`)."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string

    out = dict(PRESETS)
    for _name, flow_presets in flows.attribute("presets", "PRESETS"):
        out.update(flow_presets)
    return out


def preset(name: str) -> list[Grid]:
    known = presets()
    if name not in known:
        raise ConfigError(f"preset: unknown value {name!r} (choose from: {', '.join(known)})")
    return known[name][1]


# --- goodput search ----------------------------------------------------------------------------------------

@dataclass
class GoodputSearch:
    target: float
    good: float | None = None  # the highest rate measured to meet the target
    bad: float | None = None  # the lowest rate measured to miss it
    evaluations: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment) in run order
    unfaithful: list[float] = field(default_factory=list)  # rates whose run was not faithful, in run order

    @property
    def goodput_rps(self) -> float | None:
        """The answer: the highest rate known to meet the target (None: not even the lowest did)."""
        return self.good

    @property
    def faithful(self) -> bool:
        """Every run the bisection measured was faithful. Each one steered the bracket, so one unfaithful run
        makes the answer rest on figures the emulation did not guarantee (the sweep tables' `*`)."""
        return not self.unfaithful

    def answer(self) -> str:
        """The goodput as printed: `*` when it rests on unfaithful runs."""
        text = "-" if self.good is None else f"{self.good:g}"
        return text if self.faithful else f"{text} *"

    def bracket(self) -> str:
        def end(rate: float | None, missing: str) -> str:
            return missing if rate is None else f"{rate:g}" + ("*" if rate in self.unfaithful else "")

        text = f"[{end(self.good, 'none met the target')}, {end(self.bad, 'none missed it')}) req/s"
        if self.unfaithful:
            text += f"; {len(self.unfaithful)} of {len(self.evaluations)} runs unfaithful"
        return text


def bisect_goodput(attainment_at: Callable[[float], float], lo: float, hi: float, *,
                   target: float = DEFAULT_GOODPUT_TARGET, iterations: int = 4,
                   rel_tolerance: float = 0.05, faithful_at: Callable[[float], bool] | None = None) -> GoodputSearch:
    """Measure `hi`, then `lo`, then halve the bracket until `iterations` midpoints were run or it is within
    `rel_tolerance` of its upper end. If `hi` meets the target, that is the answer (the search says the
    bracket is open above); if `lo` misses, there is no goodput in the range. `faithful_at(rate)`, asked after
    each measurement: whether that run was faithful (the search inherits its runs' verdicts)."""
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ConfigError(f"goodput search: need 0 < low rate < high rate, got {lo!r}, {hi!r}")
    if not 0 < target <= 1:
        raise ConfigError(f"goodput search: target attainment must be in (0, 1], got {target!r}")
    if iterations < 0:
        raise ConfigError(f"goodput search: iterations must be >= 0, got {iterations!r}")
    search = GoodputSearch(target)

    def meets(rate: float) -> bool:
        attainment = attainment_at(rate)
        search.evaluations.append((rate, attainment))
        if faithful_at is not None and not faithful_at(rate):
            search.unfaithful.append(rate)
        return not math.isnan(attainment) and attainment >= target

    if meets(hi):
        search.good = hi
        return search
    search.bad = hi
    if not meets(lo):
        search.bad = lo
        return search
    search.good = lo
    for _ in range(iterations):
        if (search.bad - search.good) <= rel_tolerance * search.bad:
            break
        mid = (search.good + search.bad) / 2
        if meets(mid):
            search.good = mid
        else:
            search.bad = mid
    return search
