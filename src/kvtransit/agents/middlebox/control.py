"""The middlebox's live control API (toxiproxy's api.go is the model): read the chain, change it.

    GET  /chain    the stage chain, in order, with each stage's settings
    GET  /stats    totals (bytes, hand-offs by outcome, energy, link rate and busy)
    PUT  /kernel   {"codec": "fp8", "keep": 0.5, "block": 64, "sinks": 4, "variant": "dct",
                    "precision_bits": null, "transform_charged": false, "placement": "pluggable"}
                   (any subset; the rest keeps its value; a run starts with its scenario's values)
    PUT  /link     {"rate_Bps": 1e8, "latency_s": 0.001, "jitter_s": 0}   (shaped figures, any subset)
    GET  /faults            the active faults on the link to decode (faults/)
    PUT  /faults/NAME       {"type": "corrupt", "probability": 0.2}   add or replace a fault
    DELETE /faults/NAME     remove it (404 if there is none)

`PUT /kernel` may say how many streams the kernel combines (`"streams": N`, default 1; not stored: every
codec here takes one). This middlebox carries the KV hand-off, one stream per hand-off, so a kernel of N > 1 is
refused with a 400: on a pluggable with placement_check's reason (a pluggable sees one stream), on a switch
because the sum of N streams runs on the switch role (`kvtransit middlebox --placement switch --ranks N`).

JSON in and out. A bad body is a 400 that names the field and the value; an unknown kernel is a 400 with
the valid choices; the chain is unchanged after any error. `PUT /kernel` and `PUT /link` change the stage of
that name in the chain (stages/chain.py), and answer with the chain as `GET /chain` shows it. A kernel change
applies to hand-offs that start after it (a hand-off in flight keeps the codec its KvBegin announced).
"""

from __future__ import annotations

import math

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.faults import make_fault
from kvtransit.agents.middlebox.stages.link import LINK_FIELDS
from kvtransit.model.module.budget import KernelDeclaration, placement_check
from kvtransit.runtime.http import HttpError, HttpRequest, HttpServer

FAULTS_PREFIX = "/faults/"

KERNEL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "codec": str, "keep": (int, float), "block": int, "sinks": int, "variant": str,
    "precision_bits": (int, type(None)), "transform_charged": bool, "placement": str, "streams": int}
# Integer kernel fields beyond the longest prompt (docs/reference.md §4: lengths are capped at 32,768 tokens) mean
# nothing, and a huge transform block would make the kernel allocate without bound: refused at the API.
MAX_KERNEL_TOKENS = 32_768


def _object_body(request: HttpRequest) -> dict:
    body = request.json()
    if not isinstance(body, dict):
        raise HttpError(400, f"{request.method} {request.path} needs a JSON object, got {type(body).__name__}")
    return body


def _reject_unknown(body: dict, kind: str, known) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise HttpError(400, f"unknown {kind} field {unknown[0]!r} (fields: {', '.join(known)})")


def _kernel_update(body: dict) -> dict:
    _reject_unknown(body, "kernel", KERNEL_FIELDS)
    for name, value in body.items():
        expected = KERNEL_FIELDS[name]
        if (isinstance(value, bool) and expected is not bool) or not isinstance(value, expected):
            raise HttpError(400, f"kernel field {name!r}: bad value {value!r}")
        if name == "streams" and isinstance(value, int) and value < 1:
            raise HttpError(400, f"kernel field 'streams' must be an integer >= 1, got {value!r}")
        if name in ("block", "sinks"):
            assert isinstance(value, int)  # KERNEL_FIELDS: block and sinks are ints, checked just above
            if not 0 <= value <= MAX_KERNEL_TOKENS:
                raise HttpError(400, f"kernel field {name!r} must be in 0..{MAX_KERNEL_TOKENS}, got {value!r}")
    return body


def _refuse_combining(update: dict, middlebox: Middlebox) -> dict:
    """`update` without `streams`, after refusing a kernel that combines streams (module docstring). The
    placement judged is the process's (`--placement`), not the body's: it is where this middlebox sits."""
    streams = update.pop("streams", 1)
    if streams == 1:
        return update
    placement = middlebox.scenario.placement
    name = update.get("codec") or middlebox.kernel.name
    placed = placement_check(KernelDeclaration(name, streams=streams, placement=placement))
    if not placed.ok:
        raise HttpError(400, f"kernel {name!r} refused: {placed.describe()}; this middlebox is a {placement}")
    raise HttpError(400, f"kernel {name!r} refused: it combines {streams} streams, and this middlebox carries the KV "
                         f"hand-off, one stream per hand-off; a sum of {streams} streams runs on the switch role "
                         f"(kvtransit middlebox --placement switch --ranks {streams})")


def _link_update(body: dict) -> dict:
    # An unknown field is the link stage's to refuse (LinkStage.reconfigure: a ConfigError, so a 400 naming it
    # and the valid fields); the values of the fields it knows must be finite numbers in range.
    for name in LINK_FIELDS:
        if name not in body:
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise HttpError(400, f"link field {name!r}: expected a finite number, got {value!r}")
    if "rate_Bps" in body and body["rate_Bps"] <= 0:
        raise HttpError(400, f"link field 'rate_Bps' must be > 0, got {body['rate_Bps']!r}")
    for name in ("latency_s", "jitter_s"):
        if name in body and body[name] < 0:
            raise HttpError(400, f"link field {name!r} must be >= 0, got {body[name]!r}")
    return body


def register_control_routes(http: HttpServer, middlebox: Middlebox) -> None:
    async def get_chain(_request: HttpRequest) -> list:
        return middlebox.describe_chain()

    async def get_stats(_request: HttpRequest) -> dict:
        return middlebox.stats()

    async def put_kernel(request: HttpRequest) -> list:
        # ConfigError / KernelInputError are ValueErrors: the HTTP layer answers 400 with their message.
        return middlebox.reconfigure("kernel", _refuse_combining(_kernel_update(_object_body(request)), middlebox))

    async def put_link(request: HttpRequest) -> list:
        return middlebox.reconfigure("link", _link_update(_object_body(request)))

    async def get_faults(_request: HttpRequest) -> list:
        return middlebox.faults.describe()

    def fault_name(request: HttpRequest) -> str:
        return request.path[len(FAULTS_PREFIX):]

    async def put_fault(request: HttpRequest) -> list:
        # make_fault raises ConfigError (a ValueError: a 400 naming the field) for a bad type or parameter.
        middlebox.faults.put(make_fault(fault_name(request), _object_body(request), clock=middlebox.fault_clock))
        return middlebox.faults.describe()

    async def delete_fault(request: HttpRequest) -> list:
        name = fault_name(request)
        if not middlebox.faults.delete(name):
            raise HttpError(404, f"no fault named {name[:80]!r} (active: "
                                 f"{', '.join(f['name'] for f in middlebox.faults.describe()) or 'none'})")
        return middlebox.faults.describe()

    http.route("GET", "/faults", get_faults)
    http.route("PUT", FAULTS_PREFIX, put_fault)
    http.route("DELETE", FAULTS_PREFIX, delete_fault)
    http.route("GET", "/chain", get_chain)
    http.route("GET", "/stats", get_stats)
    http.route("PUT", "/kernel", put_kernel)
    http.route("PUT", "/link", put_link)
