"""Remote KV with query-aware selection inside `kvtransit up`: which requests are long-context, what
a decode step moves for them, and how long the model says those legs take.

A share (`remote_share`) of the requests is a long-context class: each also attends to a context of
`remote_context` tokens whose KV lives in the KV pool (a long document already prefilled and cached there). Every
decode step that runs one of them first gets that context's KV for the batch, through the middlebox and over the
decode link (the link the hand-offs cross, so both flows queue on one clock):

- **top-k** (`select="top-k"`, Quest-style; flows/selection/model.py): QUERY (decode → module: the step's queries), the
  pages' SUMMARIES cross the link into the module, which scores them (the MAC kernel, within its budget) and hands
  decode one score per page and kv head; decode ranks (the host's comparisons) and sends FETCH; the chosen pages'
  K and V (and each context's tail) cross back as PAGES;
- **all** (`select="all"`): FETCH then every token's K and V, one leg.

The step's remote requests share the legs (one QUERY, one SUMMARIES, ... a step, their bytes summed), as a batch's
attention reads its KV together. Each leg is a request over the link and its answer (docs/reference.md §2):
`2 × latency + module latency + max(bytes, module occupancy) / bandwidth`; the summaries' leg is the one the module
computes on (occupancy = bytes × charged ops / budget when transit-bound, docs/reference.md §5). `legs_model_s` is what
the run's measured legs are judged against, at the bytes they moved.

Which requests are remote is a pure function of the seed and the request id (`in_remote_class`), so the decode, the
pool and the load generator's report agree without telling each other.

Pure: stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtransit.flows.selection.model import SelectionStep
from kvtransit.model.catalog.links import Link
from kvtransit.model.serving.request_class import in_class

KV_PLACEMENTS = ("local", "remote")
SELECT_TOP_K, SELECT_ALL = "top-k", "all"
SELECT_MODES = (SELECT_TOP_K, SELECT_ALL)

def in_remote_class(seed: int, request_id: int, share: float) -> bool:
    """Whether request `request_id` of a run seeded `seed` attends to a remote context (a fraction `share` of ids)."""
    return in_class(seed, request_id, share)


@dataclass(frozen=True)
class RemoteLegs:
    """What one decode step's remote legs move for `requests` long-context requests, model bytes."""

    selection: SelectionStep
    requests: int

    @property
    def selects(self) -> bool:
        return self.selection.budget is not None

    @property
    def summary_bytes(self) -> int:
        return self.requests * self.selection.summary_bytes

    @property
    def page_bytes(self) -> int:
        """The chosen pages' K and V and each context's tail (every token without selection)."""
        return self.requests * (self.selection.chosen_kv_bytes if self.selects else self.selection.all_kv_bytes)

    @property
    def attended_tokens(self) -> int:
        """Remote tokens the step's attention reads, over its remote requests."""
        s = self.selection
        return self.requests * (s.chosen_pages * s.page_size + s.tail_tokens if self.selects else s.context_tokens)


def leg_s(link: Link, nbytes: float, *, module_latency_s: float = 0.0, occupy_bytes: float | None = None) -> float:
    """One leg: the request's latency, then the answer's (+ the module's) and its bytes' time on the link."""
    on_link = nbytes if occupy_bytes is None else max(nbytes, occupy_bytes)
    return 2 * link.latency_s + module_latency_s + on_link / link.bandwidth_Bps


def legs_model_s(link: Link, summary_bytes: float, page_bytes: float, *, module_latency_s: float,
                 occupancy: float) -> float:
    """A step's legs at the bytes they moved (summary_bytes 0: no selection, one leg). `occupancy`: the module's
    link bytes per summary byte when the scoring is transit-bound (≤ 1: the wire's own time)."""
    pages = leg_s(link, page_bytes, module_latency_s=module_latency_s)
    if not summary_bytes:
        return pages
    occupy = summary_bytes * occupancy if occupancy > 1 else None
    return leg_s(link, summary_bytes, module_latency_s=module_latency_s, occupy_bytes=occupy) + pages


def occupy_bytes(nbytes: int, occupancy: float) -> int | None:
    """How many bytes' time `nbytes` of summaries hold the link when the module is slower than the wire."""
    return math.ceil(nbytes * occupancy) if occupancy > 1 else None
