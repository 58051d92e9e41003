"""One encrypted layer served across an emulated link: y = x·W + b on a CKKS-encrypted x (TenSEAL, Microsoft SEAL).

The client holds the secret key. Once per session it sends the server the public context (public, relinearisation
and Galois keys; no secret key); then per request it encrypts x (a `width`-vector), sends the ciphertext, the
server computes the vector-matrix product and bias on the ciphertext (rotations and one multiplicative level) with
plaintext W and b, and sends the result ciphertext back for the client to decrypt. Both directions go through a
`ShapedStreamWriter` (the egress shaper's token bucket and delay line) over loopback TCP, at a dilation that holds
the host's own cost of moving a ciphertext (copies, the socket, the loop) within the model's band
(`layer_dilation`, flows/ciphertext/serial_dilation.py: undilated, a 221 µs transfer over eth-25g read ~4x the model).

Measured per request on the injected clock: encrypt, up (client's ciphertext ready → server has it), compute
(on a worker thread, this CPU), down (result ready → client has it), decrypt; the transfer's share is
(up + down) / the request's whole time, all in model seconds (link times divided by the dilation; the compute,
encryption and decryption are this CPU's, measured). The error is against float64 numpy on the same x, W, b.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvtransit.flows.ciphertext.message_framing import HEADER_BYTES, frame, read_message
from kvtransit.flows.ciphertext.serial_dilation import UNDILATED, UNSHAPED_RATE_BPS, SerialDilation, plan
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.shaped_stream import ShapedStreamWriter, shaped_loopback

NOT_INSTALLED = "not installed: pip install .[fhe]"
# The task's CKKS parameters (TenSEAL's tutorial set): ring degree 8192, moduli 60/40/40/60 bits (log Q = 200,
# within the HE standard's 218 bits for 128-bit security at N = 8192), scale 2^40 (the middle primes' size, so a
# rescale after the one multiplication keeps the scale). Two 40-bit levels: one product, with room to spare.
POLY_MODULUS_DEGREE = 8192
COEFF_MOD_BIT_SIZES = (60, 40, 40, 60)
GLOBAL_SCALE = 2.0 ** 40
LAYER_WIDTH = 64  # the task's small layer: a 64 × 64 vector-matrix product
# CKKS is approximate: with a 2^40 scale a 64-term dot product of O(1) values is off by ~1e-6 (measured 2.5e-7
# here); 1e-3 fails a real loss of precision (a wrong scale or a missing rescale is off by far more).
ERROR_TOLERANCE = 1e-3
KIND_CONTEXT, KIND_INPUT, KIND_OUTPUT, KIND_BYE = 10, 11, 12, 13
# Requests over an unshaped link to measure the host's cost of moving a request's two ciphertexts (the median).
CALIBRATION_REQUESTS = 3


class NotInstalled(RuntimeError):
    """TenSEAL is not installed; the message says which extra installs it."""


def load_tenseal() -> Any:
    try:
        import tenseal  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise NotInstalled(NOT_INSTALLED) from None
    return tenseal


@dataclass
class FheReport:
    requests: int
    width: int
    rate_Bps: float
    latency_s: float
    context_bytes: int  # the public context, once per session (keys: public, relinearisation, Galois)
    setup_s: float  # its transfer, measured (model seconds)
    input_ciphertext_bytes: int
    output_ciphertext_bytes: int
    encrypt_s: list[float] = field(default_factory=list)
    up_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    down_s: list[float] = field(default_factory=list)
    decrypt_s: list[float] = field(default_factory=list)
    request_s: list[float] = field(default_factory=list)
    max_abs_error: float = 0.0
    dilation: SerialDilation = UNDILATED

    @property
    def transfer_share(self) -> float:
        """Median over requests of (up + down) / request time."""
        return statistics.median((u + d) / r for u, d, r in zip(self.up_s, self.down_s, self.request_s, strict=True))

    @property
    def modelled_transfer_s(self) -> float:
        return transfer_model_s(self.input_ciphertext_bytes, self.output_ciphertext_bytes, self.rate_Bps,
                                self.latency_s)

    @property
    def transfer_s_median(self) -> float:
        return statistics.median(u + d for u, d in zip(self.up_s, self.down_s, strict=True))

    @property
    def within_tolerance(self) -> bool:
        return self.max_abs_error <= ERROR_TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"transfer_share": self.transfer_share, "modelled_transfer_s": self.modelled_transfer_s,
                               "transfer_s_median": self.transfer_s_median,
                               "error_tolerance": ERROR_TOLERANCE, "within_tolerance": self.within_tolerance,
                               "ckks": {"poly_modulus_degree": POLY_MODULUS_DEGREE,
                                        "coeff_mod_bit_sizes": list(COEFF_MOD_BIT_SIZES), "scale_bits": 40}}


def transfer_model_s(input_bytes: int, output_bytes: int, rate_Bps: float, latency_s: float) -> float:
    """Both ciphertexts on the link model: 2·latency + (in + out + framing) / rate (docs/reference.md §2)."""
    return 2 * latency_s + (input_bytes + output_bytes + 2 * HEADER_BYTES) / rate_Bps


async def layer_dilation(asked: float | str, *, rate_Bps: float, latency_s: float, width: int = LAYER_WIDTH,
                         clock: Clock | None = None) -> SerialDilation:
    """The dilation to serve the layer over (rate_Bps, latency_s) at: `asked`, or under "auto" the least that holds
    the host's cost of a request's two ciphertexts (measured over an unshaped link) within the model's band."""
    sizes: list[int] = []

    async def host_floor_s() -> float:
        unshaped = await run_encrypted_layer(CALIBRATION_REQUESTS, rate_Bps=UNSHAPED_RATE_BPS, latency_s=0.0,
                                             width=width, clock=clock)
        sizes[:] = [unshaped.input_ciphertext_bytes, unshaped.output_ciphertext_bytes]
        return unshaped.transfer_s_median

    return await plan(asked, lambda: transfer_model_s(sizes[0], sizes[1], rate_Bps, latency_s), host_floor_s)


async def dilated_layer(requests: int, *, rate_Bps: float, latency_s: float,
                        dilation: float | str = "auto") -> FheReport:
    """`run_encrypted_layer` at the dilation `layer_dilation` takes for `dilation` (what the command and the
    candidate row run)."""
    planned = await layer_dilation(dilation, rate_Bps=rate_Bps, latency_s=latency_s)
    return await run_encrypted_layer(requests, rate_Bps=rate_Bps, latency_s=latency_s, dilation=planned)


def _client_context(ts: Any) -> Any:
    context = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=POLY_MODULUS_DEGREE,
                         coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES))
    context.global_scale = GLOBAL_SCALE
    context.generate_galois_keys()  # the vector-matrix product rotates the ciphertext
    return context


def _encrypt(ts: Any, context: Any, x: np.ndarray) -> bytes:
    return bytes(ts.ckks_vector(context, x.tolist()).serialize())


async def run_encrypted_layer(requests: int = 3, *, rate_Bps: float, latency_s: float, width: int = LAYER_WIDTH,
                              seed: int = 0, dilation: SerialDilation = UNDILATED,
                              clock: Clock | None = None) -> FheReport:
    """Serve `requests` encrypted y = x·W + b over one loopback connection shaped at (rate_Bps, latency_s), time
    dilated by `dilation` (the link at rate / D and latency × D; its times reported in model seconds)."""
    if requests < 1 or width < 1:
        raise ValueError(f"requests and width must be >= 1, got {requests} and {width}")
    ts = load_tenseal()
    clock = clock if clock is not None else MonotonicClock()
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((width, width)) / np.sqrt(width)  # unit-variance outputs for unit inputs
    bias = rng.standard_normal(width)
    secret_context = _client_context(ts)
    public_context = secret_context.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=True,
                                              save_relin_keys=True)
    # What the server measures, read by the client after each reply (one process, one clock).
    server_times: dict[str, int] = {}
    context_arrived = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, link: ShapedStreamWriter) -> None:
        _, blob = await read_message(reader, {KIND_CONTEXT: None}, "fhe server")
        server_times["context_received"] = clock.now_ns()
        context_arrived.set()
        context = await asyncio.to_thread(ts.context_from, blob)
        if context.has_secret_key():
            raise RuntimeError("fhe server: the client sent its secret key")
        while True:
            kind, payload = await read_message(reader, {KIND_INPUT: None, KIND_BYE: 0}, "fhe server")
            if kind == KIND_BYE:
                break
            server_times["received"] = start = clock.now_ns()

            def layer(data: bytes = payload) -> bytes:
                x = ts.ckks_vector_from(context, data)
                return bytes(x.mm(weights.tolist()).add(bias.tolist()).serialize())

            out = await asyncio.to_thread(layer)
            server_times["computed"] = clock.now_ns()
            server_times["compute_ns"] = server_times["computed"] - start
            await link.send(frame(KIND_OUTPUT, out))

    report = FheReport(requests, width, rate_Bps, latency_s, context_bytes=len(public_context), setup_s=0.0,
                       input_ciphertext_bytes=0, output_ciphertext_bytes=0, dilation=dilation)
    d = dilation.dilation
    async with shaped_loopback(serve, rate_Bps=rate_Bps / d, latency_s=latency_s * d, clock=clock) as connection:
        reader, link = connection.reader, connection.link
        sent = clock.now_ns()
        await link.send(frame(KIND_CONTEXT, public_context))
        await context_arrived.wait()
        report.setup_s = (server_times["context_received"] - sent) / 1e9 / d
        for _ in range(requests):
            x = rng.standard_normal(width)
            start = clock.now_ns()
            ciphertext = await asyncio.to_thread(_encrypt, ts, secret_context, x)
            encrypted = clock.now_ns()
            await link.send(frame(KIND_INPUT, ciphertext))
            _, result = await read_message(reader, {KIND_OUTPUT: None}, "fhe client")
            arrived = clock.now_ns()
            y = np.array(ts.ckks_vector_from(secret_context, result).decrypt())
            done = clock.now_ns()
            report.input_ciphertext_bytes, report.output_ciphertext_bytes = len(ciphertext), len(result)
            report.encrypt_s.append((encrypted - start) / 1e9)
            up_ns, down_ns = server_times["received"] - encrypted, arrived - server_times["computed"]
            report.up_s.append(up_ns / 1e9 / d)
            report.compute_s.append(server_times["compute_ns"] / 1e9)
            report.down_s.append(down_ns / 1e9 / d)
            report.decrypt_s.append((done - arrived) / 1e9)
            # The request's wall time with its two link times taken at model time (the rest is this CPU's).
            report.request_s.append((done - start - (up_ns + down_ns) * (1 - 1 / d)) / 1e9)
            report.max_abs_error = max(report.max_abs_error, float(np.abs(y - (x @ weights + bias)).max()))
        await link.send(frame(KIND_BYE, b""))
        await connection.served
    return report
