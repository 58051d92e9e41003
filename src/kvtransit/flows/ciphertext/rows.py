"""The ciphertexts' rows of the candidate table: pq-key-exchange (ML-KEM-768 handshakes over a shaped loopback link;
link time / handshake time) and fhe-inference (the CKKS encrypted layer over the same link; (up + down) / request
time)."""

from __future__ import annotations

import asyncio
import json

from kvtransit.harness.studies.candidates.rows import Row, RowContext, RowRun, not_run, serial_faithful
from kvtransit.harness.studies.candidates.table import LINE_INPUT, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name

PQ_SESSIONS = 5
FHE_REQUESTS = 3


def row_pq_key_exchange(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.handshake import NotInstalled, dilated_handshakes
    from kvtransit.kernels import ntt

    link = link_by_name(ctx.link)
    command = f"python -m kvtransit.flows.ciphertext --sessions {PQ_SESSIONS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_handshakes(PQ_SESSIONS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return not_run(ctx, ntt.declaration(), str(exc), command)
    (ctx.run_dir / "pqkex.json").write_text(json.dumps(rep.as_dict(), indent=1, default=str))
    link_s = sum(rep.link_s_per_session)
    share = link_s / (link_s + rep.compute_s) if link_s + rep.compute_s > 0 else None
    wrong = (rep.sessions - rep.secrets_equal + (0 if rep.ntt_check is None or rep.ntt_check.ok else 1)
             + (1 if rep.reference_agrees is False else 0))
    median_link = rep.link_s_median
    faithful = serial_faithful(median_link, rep.modelled_link_s, rep.dilation, "a handshake's link time")
    row = RowMeasured(
        ctx.name, ntt.declaration(True), share,
        f"link time of a handshake / its whole time (KEM compute measured on this CPU: {rep.kem_implementation})",
        decl_other_transform=ntt.declaration(False), link=ctx.link,
        link_bytes=float(rep.bytes_client_to_server + rep.bytes_server_to_client) / rep.sessions, link_messages=2,
        line=LINE_INPUT, precision=PrecisionFigure(
            float(wrong), 0.0, "sessions whose secrets differ + an NTT check that failed (kyber-py's arithmetic) + a "
                               "key kyber-py derives differently from the compiled KEM",
            required_bits=((ntt.Q - 1) ** 2).bit_length()),
        streams=1.0, streams_as="connections a handshake uses (one client to one server)", share_whole="a handshake",
        streams_counted=False,
        notes=((f"required bits {((ntt.Q - 1) ** 2).bit_length()}: a product of two coefficients mod q = {ntt.Q} "
               "before its reduction"),))
    return RowRun(row, 1.0, rep.dilation.dilation, faithful, command, str(ctx.run_dir),
                  measured_what=f"{rep.sessions} handshakes ({rep.kem_implementation}): link and compute time, "
                                "shared secrets, the NTT against kyber-py's arithmetic", modelled_what="nothing",
                  extra={"session_rate": rep.session_rate, "link_s_median": median_link,
                         "modelled_link_s": rep.modelled_link_s, "compute_s": rep.compute_s, "kem": rep.kem,
                         "kem_implementation": rep.kem_implementation, "reference_agrees": rep.reference_agrees})


def row_fhe_inference(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.encrypted_layer import (
        COEFF_MOD_BIT_SIZES,
        ERROR_TOLERANCE,
        NotInstalled,
        dilated_layer,
    )
    from kvtransit.kernels import ntt

    link = link_by_name(ctx.link)
    command = f"python -m kvtransit.flows.ciphertext.fhe --requests {FHE_REQUESTS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_layer(FHE_REQUESTS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return not_run(ctx, ntt.declaration(), str(exc), command)
    (ctx.run_dir / "fhe.json").write_text(json.dumps(rep.as_dict(), indent=1, default=str))
    row = RowMeasured(
        ctx.name, ntt.declaration(True), rep.transfer_share, "ciphertexts' transfer (up + down) / request time",
        decl_other_transform=ntt.declaration(False), link=ctx.link,
        link_bytes=float(rep.input_ciphertext_bytes + rep.output_ciphertext_bytes), link_messages=2, line=LINE_INPUT,
        precision=PrecisionFigure(rep.max_abs_error, ERROR_TOLERANCE, "largest |decrypted − float64| of the layer",
                                  required_bits=max(COEFF_MOD_BIT_SIZES)),
        streams=1.0, streams_as="connections a request uses (one client to one server)", share_whole="a request",
        streams_counted=False,
        notes=(("the kernel is the NTT declaration of kernels/ntt.py (ML-KEM's), a proxy for CKKS's NTTs over "
               f"{max(COEFF_MOD_BIT_SIZES)}-bit primes: the same butterflies, wider moduli"),
               f"required bits {max(COEFF_MOD_BIT_SIZES)}: CKKS's largest coefficient modulus"))
    return RowRun(row, 1.0, rep.dilation.dilation,
                  serial_faithful(rep.transfer_s_median, rep.modelled_transfer_s, rep.dilation,
                                   "the ciphertexts' transfer"), command, str(ctx.run_dir),
                  measured_what=f"{rep.requests} encrypted requests: encrypt, up, compute, down, decrypt; the error",
                  modelled_what="nothing",
                  extra={"transfer_share": rep.transfer_share, "max_abs_error": rep.max_abs_error,
                         "ciphertext_bytes": [rep.input_ciphertext_bytes, rep.output_ciphertext_bytes]})


ROWS = (
    Row(Candidate("fhe-inference", "CKKS ciphertexts of an encrypted layer, client to server and back",
              "NTT and modular arithmetic (kernels/ntt.py: declaration, as the module's FHE demonstration)",
              "the decrypted result within CKKS's own error (flows/ciphertext/fhe: ERROR_TOLERANCE) of float64"),
        link="eth-25g", order=8, run=row_fhe_inference),
    Row(Candidate("pq-key-exchange", "ML-KEM-768 handshakes: the encapsulation key out, the ciphertext back",
              "NTT and modular arithmetic (kernels/ntt.py: declaration)",
              "both sides' shared secrets equal and the module's NTT equal to the library's arithmetic"),
        link="eth-25g", order=9, run=row_pq_key_exchange),
)
