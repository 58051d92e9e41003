"""The ciphertexts' rows of the candidate table.

- pq-key-exchange: ML-KEM-768 handshakes over a shaped loopback link, the compiled KEM (OpenSSL, by `cryptography`)
  measured on this host. A handshake happens once a session, so its share is of what the session's user waits
  for: its link time over the handshake and the session's requests (`SESSION_REQUESTS` of the hand-off row's
  requests, their E2E by the twin: stated, and modelled); the handshake's own link share beside it. Regime: link ×
  requests a session.
- fhe-inference: the CKKS encrypted layer over the same link (TenSEAL, i.e. SEAL compiled, measured on this host);
  (up + down) / request time. Its kernel is CKKS's own declaration (model/module/ckks.py: a key switch at the run's
  N = 8,192 and 60/40/40/60-bit moduli, docs/reference.md §7.10), not ML-KEM's. Regime: link × an FHE engine
  faster than this host's.

Both: required bits by one rule (model/module/ckks.py: required_bits, a product of two residues before its
reduction): 24 for ML-KEM's q = 3,329, 120 for CKKS's 60-bit primes.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from kvtransit.harness.studies.candidates.rows import DeckVerdict, Row, RowContext, RowRun, not_run, serial_faithful
from kvtransit.harness.studies.candidates.table import (
    CANDIDATE,
    LINE_INPUT,
    NOT_A_CANDIDATE,
    Candidate,
    PrecisionFigure,
    RowMeasured,
)
from kvtransit.model.catalog.links import LINKS, link_by_name
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE

PQ_SESSIONS = 5
FHE_REQUESTS = 3
# A session's requests: the sessions workload's default turns (flows/tier/section.py: session_turns 4), each one of
# the hand-off row's requests (llama3-8b, 2,048-token prompts, 64-token outputs), their E2E by the twin on the row's
# link. A stated choice: a longer session only shrinks the handshake's share further.
SESSION_REQUESTS = 4
CIPHERTEXT_LINKS = ("eth-25g", "eth-100g", "ib-ndr", "nvlink4")
SESSION_LENGTHS = (1, 2, 4, 8, 16, 64)
# How much faster than this host's SEAL an FHE engine could be (a GPU library, an ASIC): the regime's other axis.
FHE_SPEEDUPS = (1.0, 10.0, 100.0, 1000.0, 10000.0)
# Bulk link encryption, the job after a handshake: AES-GCM, which NICs and switches already run inline (MACsec,
# IPsec offload); it needs table lookups or a GF(2^8) S-box the module does not publish (docs/reference.md §5.2).
AES_NOTE = ("the session's bulk traffic after the handshake is AES-GCM, which NICs and switches already encrypt "
            "inline (MACsec, IPsec offload): that job exists, outside the module's op set; the handshake's KEM has "
            "no incumbent on the link")


def _mlkem_required_bits() -> int:
    from kvtransit.kernels import ntt
    from kvtransit.model.module.ckks import required_bits

    return required_bits([(ntt.Q - 1).bit_length()])


def session_share(link_s: float, compute_s: float, session_s: float) -> float:
    """A handshake's link time over what its session's user waits for: the handshake and the session's requests."""
    whole = link_s + compute_s + session_s
    return link_s / whole if whole > 0 else math.nan


def row_pq_key_exchange(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.handshake import NotInstalled, dilated_handshakes
    from kvtransit.harness.studies.candidates.kv_rows import request_e2e_s
    from kvtransit.kernels import ntt

    link = link_by_name(ctx.link)
    requests = int(ctx.setting("session_requests", SESSION_REQUESTS))
    command = f"python -m kvtransit.flows.ciphertext --sessions {PQ_SESSIONS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_handshakes(PQ_SESSIONS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return not_run(ctx, ntt.declaration(), str(exc), command)
    summary = rep.as_dict()
    (ctx.run_dir / "pqkex.json").write_text(json.dumps(summary, indent=1, default=str))
    link_s = rep.link_s_median
    compute_s = rep.compute_s / rep.sessions
    request_s = request_e2e_s(ctx.link, str(ctx.sample_path))
    share = session_share(link_s, compute_s, requests * request_s)
    own = link_s / (link_s + compute_s) if link_s + compute_s > 0 else None
    wrong = (rep.sessions - rep.secrets_equal + (0 if rep.ntt_check is None or rep.ntt_check.ok else 1)
             + (1 if rep.reference_agrees is False else 0))
    faithful = serial_faithful(link_s, rep.modelled_link_s, rep.dilation, "a handshake's link time")
    bits = _mlkem_required_bits()
    row = RowMeasured(
        ctx.name, ntt.declaration(True), share,
        f"a handshake's link time over its session: the handshake and its {requests} requests "
        f"({request_s * 1e3:.0f} ms each)",
        decl_other_transform=ntt.declaration(False), link=ctx.link,
        link_bytes=float(rep.bytes_client_to_server + rep.bytes_server_to_client) / rep.sessions, link_messages=2,
        line=LINE_INPUT, precision=PrecisionFigure(
            float(wrong), 0.0, "sessions whose secrets differ + an NTT check that failed (kyber-py's arithmetic) + a "
                               "key kyber-py derives differently from the compiled KEM", required_bits=bits),
        streams=1.0, streams_as="connections a handshake uses (one client to one server)", share_whole="a session",
        streams_counted=False, compute_basis=f"measured: {rep.kem_implementation}'s ML-KEM-768 on this host",
        share_factor=(f"the session's {requests} requests' E2E ({request_s * 1e3:.0f} ms each) is the twin's, for the "
                      f"hand-off row's requests on {ctx.link} (a stated session: {requests} turns)"),
        share_context=(f"the handshake alone: its link {own:.1%} of its own time (measured)" if own is not None
                       else "the handshake alone: not measured",),
        notes=((f"required bits {bits}: a product of two coefficients mod q = {ntt.Q} before its reduction "
                "(model/module/ckks.py: required_bits, the one rule for modular kernels)"), AES_NOTE))
    return RowRun(row, 1.0, rep.dilation.dilation, faithful, command, str(ctx.run_dir),
                  measured_what=f"{rep.sessions} handshakes ({rep.kem_implementation}): link and compute time, "
                                "shared secrets, the NTT against kyber-py's arithmetic",
                  modelled_what=f"the session's {requests} requests' E2E (the twin, the hand-off row's scenario)",
                  extra={"session_rate": rep.session_rate, "link_s_median": link_s,
                         "modelled_link_s": rep.modelled_link_s, "compute_s": rep.compute_s, "kem": rep.kem,
                         "kem_implementation": rep.kem_implementation, "reference_agrees": rep.reference_agrees,
                         "handshake_share": own, "session_request_e2e_s": request_s, "session_requests": requests},
                  evidence={"handshakes": summary})


def row_fhe_inference(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.encrypted_layer import (
        COEFF_MOD_BIT_SIZES,
        ERROR_TOLERANCE,
        NotInstalled,
        dilated_layer,
    )
    from kvtransit.model.module import ckks

    link = link_by_name(ctx.link)
    command = f"python -m kvtransit.flows.ciphertext.fhe --requests {FHE_REQUESTS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_layer(FHE_REQUESTS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return not_run(ctx, ckks.declaration(), str(exc), command)
    summary = rep.as_dict()
    (ctx.run_dir / "fhe.json").write_text(json.dumps(summary, indent=1, default=str))
    bits = ckks.required_bits(COEFF_MOD_BIT_SIZES)
    count = ckks.key_switch_count()
    row = RowMeasured(
        ctx.name, ckks.declaration(True), rep.transfer_share, "ciphertexts' transfer (up + down) / request time",
        decl_other_transform=ckks.declaration(False), link=ctx.link,
        link_bytes=float(rep.input_ciphertext_bytes + rep.output_ciphertext_bytes), link_messages=2, line=LINE_INPUT,
        precision=PrecisionFigure(rep.max_abs_error, ERROR_TOLERANCE, "largest |decrypted − float64| of the layer",
                                  required_bits=bits),
        streams=1.0, streams_as="connections a request uses (one client to one server)", share_whole="a request",
        streams_counted=False, compute_basis="measured: TenSEAL (Microsoft SEAL, compiled) on this host",
        notes=((f"the kernel is CKKS's own (model/module/ckks.py, docs/reference.md §7.10): a key switch at N = "
                f"{count.ring_degree:,}, ℓ = {count.level}, {count.total:,} ops on {count.ciphertext_bytes:,} B of "
                f"ciphertext = {count.ops_per_byte():.1f} op/B ({count.ops_per_byte(False):.2f} with its NTTs free); "
                f"the module would hold the key: {ckks.key_bytes() / 1e6:.1f} MB a rotation step"),
               (f"required bits {bits}: a product of two residues mod CKKS's {max(COEFF_MOD_BIT_SIZES)}-bit primes "
                "before its reduction (the one rule), beyond any analogue path (1..32 bits)")))
    return RowRun(row, 1.0, rep.dilation.dilation,
                  serial_faithful(rep.transfer_s_median, rep.modelled_transfer_s, rep.dilation,
                                  "the ciphertexts' transfer"), command, str(ctx.run_dir),
                  measured_what=f"{rep.requests} encrypted requests: encrypt, up, compute, down, decrypt; the error",
                  modelled_what="nothing (the kernel's cost is CKKS's declaration, counted)",
                  extra={"transfer_share": rep.transfer_share, "max_abs_error": rep.max_abs_error,
                         "ciphertext_bytes": [rep.input_ciphertext_bytes, rep.output_ciphertext_bytes],
                         "compute_s": sum(rep.compute_s) / len(rep.compute_s) if rep.compute_s else None,
                         "request_s": sum(rep.request_s) / len(rep.request_s) if rep.request_s else None},
                  evidence={"layer": summary})


# --- regimes -----------------------------------------------------------------------------------------------------

def _pq_model(ctx: RowContext, own: RowRun, requests: int, link_name: str) -> Any:
    """The handshake on `link_name` by the link model (flows/ciphertext/model.py) with the KEM's compute as measured,
    over a session of `requests` requests (their E2E by the twin)."""
    from kvtransit.flows.ciphertext.message_framing import HEADER_BYTES
    from kvtransit.flows.ciphertext.model import HandshakeModel
    from kvtransit.harness.studies.candidates.kv_rows import request_e2e_s
    from kvtransit.harness.studies.candidates.regimes import PointModel

    link = link_by_name(link_name)
    compute = own.extra.get("compute_s")
    if not isinstance(compute, int | float):
        return PointModel(None, {"bottleneck": None}, "no compute measured")
    link_s = HandshakeModel(link.bandwidth_Bps, link.latency_s, HEADER_BYTES).link_s
    share = session_share(link_s, compute / PQ_SESSIONS, requests * request_e2e_s(link_name, str(ctx.sample_path)))
    return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})


def _fhe_model(ctx: RowContext, own: RowRun, speedup: float, link_name: str) -> Any:
    """The layer's two ciphertexts on `link_name` by the link model, the rest of a request (encrypt, compute,
    decrypt: as measured here) `speedup` times faster."""
    from kvtransit.flows.ciphertext.encrypted_layer import transfer_model_s
    from kvtransit.harness.studies.candidates.regimes import PointModel

    sizes, request, transfer = (own.extra.get("ciphertext_bytes"), own.extra.get("request_s"),
                                own.extra.get("transfer_share"))
    if not (isinstance(sizes, list) and isinstance(request, int | float) and isinstance(transfer, int | float)):
        return PointModel(None, {"bottleneck": None}, "nothing measured")
    rest = request * (1 - transfer)
    link = link_by_name(link_name)
    t = transfer_model_s(int(sizes[0]), int(sizes[1]), link.bandwidth_Bps, link.latency_s)
    share = t / (t + rest / speedup)
    return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})


def _pq_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    return Regime(Axis("session_requests", "requests a session", SESSION_LENGTHS, "requests"),
                  Axis("link", "link", CIPHERTEXT_LINKS, choices=tuple(LINKS)), _pq_model,
                  "flows/ciphertext/model.py's handshake link time, the KEM's compute as measured here, the "
                  "session's requests' E2E by the twin",
                  home=lambda ctx: (int(ctx.setting("session_requests", SESSION_REQUESTS)), ctx.link))


def _fhe_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    return Regime(Axis("speedup", "FHE engine speed (× this host's SEAL)", FHE_SPEEDUPS, "x"),
                  Axis("link", "link", CIPHERTEXT_LINKS, choices=tuple(LINKS)), _fhe_model,
                  "the ciphertexts' link model (flows/ciphertext/encrypted_layer.py: transfer_model_s), the rest of "
                  "a request as measured here divided by the engine's speed-up",
                  home=lambda ctx: (1.0, ctx.link), runnable=lambda speedup, _link: speedup == 1.0)


def pq_spec() -> Any:
    from kvtransit.flows.ciphertext.model import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES
    from kvtransit.harness.studies.candidates.spec import modular_case
    from kvtransit.kernels import ntt

    # benchmarks/RESULTS.md "Ciphertexts: which ML-KEM": the compiled KEM's whole handshake, 0.24 ms on this host
    # (an upper bound on the NTTs the module would take off it).
    compiled_handshake_s = 0.24e-3
    return modular_case("one ML-KEM-768 handshake (ek + ct on the link)", ntt.declaration(True),
                        float(MLKEM768_EK_BYTES + MLKEM768_CT_BYTES), "eth-25g", other_s=compiled_handshake_s,
                        other_j=None, other_what="the host's compiled ML-KEM (0.24 ms a handshake, measured: "
                        "benchmarks/RESULTS.md; its energy is not in the catalogue)",
                        bits=f"{_mlkem_required_bits()} (exact products mod 3,329)")


def fhe_spec() -> Any:
    from kvtransit.harness.studies.candidates.spec import modular_case
    from kvtransit.model.module import ckks

    count = ckks.key_switch_count()
    return modular_case("one key switch of the layer's input ciphertext", ckks.declaration(True),
                        float(count.ciphertext_bytes), "eth-25g", other_s=None, other_j=None, other_what="",
                        extra_hbm_bytes=float(ckks.key_bytes()),
                        bits=f"{ckks.required_bits(ckks.COEFF_MOD_BITS)} (exact products mod 60-bit primes)",
                        note="the module must also hold the key-switching keys (1.6 MB a rotation step)")


ROWS = (
    Row(Candidate("fhe-inference", "CKKS ciphertexts of an encrypted layer, client to server and back",
                  "a CKKS key switch on each ciphertext (model/module/ckks.py: NTTs and modular arithmetic at N = "
                  "8,192, moduli 60/40/40/60)",
                  "the decrypted result within CKKS's own error (flows/ciphertext/fhe: ERROR_TOLERANCE) of float64"),
        link="eth-25g", order=8, run=row_fhe_inference, deck=DeckVerdict(CANDIDATE, "proven technically"),
        regime=_fhe_regime(), spec=fhe_spec),
    Row(Candidate("pq-key-exchange", "ML-KEM-768 handshakes: the encapsulation key out, the ciphertext back",
                  "NTT and modular arithmetic (kernels/ntt.py: declaration)",
                  "both sides' shared secrets equal and the module's NTT equal to the library's arithmetic"),
        link="eth-25g", order=9, run=row_pq_key_exchange, deck=DeckVerdict(NOT_A_CANDIDATE, "negligible payoff"),
        regime=_pq_regime(), spec=pq_spec),
)
