"""ML-KEM-768 handshakes across an emulated link on loopback TCP (docs/reference.md §7: "once per session").

A server (asyncio) listens on 127.0.0.1; a client dials it and runs `sessions` handshakes one after another:
KeyGen, the 1,184-byte encapsulation key to the server, Encaps there, the 1,088-byte ciphertext back, Decaps.
Each direction's messages go through a `ShapedStreamWriter` (the egress shaper's token bucket and delay line),
so they arrive when the link model says, at a dilation that holds the host's own cost of a message within the
model's band (`handshake_dilation`, flows/ciphertext/serial_dilation.py: a 41 µs link time is of the order of the
host's). Both sides' shared secrets are compared session by session; the report
gives the session rate, the bytes each way, the KEM compute measured on this CPU (by the KEM `kem.py` names: the
compiled one by default, where a verdict reads its speed) and the link time measured against the model
(`flows/ciphertext/model.py: HandshakeModel`). The module's NTT kernel is checked against kyber-py's arithmetic on
the first session's key pair as the server received it (`ntt_check.py`; with the compiled KEM, kyber-py's expansion
of that key's seed, whose encapsulation key must equal the one that crossed the link).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from kvtransit.flows.ciphertext.kem import DEFAULT_KEM, NotInstalled, load_kem, reference_kem
from kvtransit.flows.ciphertext.message_framing import HEADER_BYTES, frame, read_message
from kvtransit.flows.ciphertext.model import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES, HandshakeModel
from kvtransit.flows.ciphertext.ntt_check import NttCheck, check_against_library
from kvtransit.flows.ciphertext.serial_dilation import UNDILATED, UNSHAPED_RATE_BPS, SerialDilation, plan
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.shaped_stream import ShapedStreamWriter, shaped_loopback

KIND_EK, KIND_CT, KIND_BYE = 1, 2, 3
# Handshakes over an unshaped link to measure the host's cost of one (the median is taken: the first one also
# warms the KEM's code paths).
CALIBRATION_SESSIONS = 5

__all__ = ["HandshakeReport", "NotInstalled", "dilated_handshakes", "handshake_dilation", "run_handshakes"]


@dataclass
class HandshakeReport:
    sessions: int
    secrets_equal: int  # sessions whose two shared secrets matched
    rate_Bps: float
    latency_s: float
    bytes_client_to_server: int  # on the link, framing included
    bytes_server_to_client: int
    elapsed_s: float  # model seconds: the sessions' compute (this CPU) + their link times
    compute_s: float  # KeyGen + Encaps + Decaps over all sessions, on this CPU
    link_s_per_session: list[float] = field(default_factory=list)  # (handshake time − its compute) / dilation
    modelled_link_s: float = 0.0
    ntt_check: NttCheck | None = None
    dilation: SerialDilation = UNDILATED
    kem: str = DEFAULT_KEM  # kem.py's name of the KEM that ran
    kem_implementation: str = ""  # what it is, with its version
    # With the compiled KEM: does kyber-py's expansion of the first key's seed give the very encapsulation key that
    # crossed the link (None: no NTT check ran)?
    reference_agrees: bool | None = None

    @property
    def session_rate(self) -> float:
        return self.sessions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def all_secrets_equal(self) -> bool:
        return self.secrets_equal == self.sessions

    @property
    def link_s_median(self) -> float:
        return statistics.median(self.link_s_per_session)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ntt_check"] = None if self.ntt_check is None else self.ntt_check.as_dict()
        out["session_rate"] = self.session_rate
        out["link_s_median"] = self.link_s_median
        return out


async def handshake_dilation(asked: float | str, *, rate_Bps: float, latency_s: float,
                             clock: Clock | None = None, kem: str = DEFAULT_KEM) -> SerialDilation:
    """The dilation to run handshakes over (rate_Bps, latency_s) at: `asked`, or under "auto" the least that holds
    the host's cost of a handshake's two messages (measured over an unshaped link) within the model's band."""
    async def host_floor_s() -> float:
        unshaped = await run_handshakes(CALIBRATION_SESSIONS, rate_Bps=UNSHAPED_RATE_BPS, latency_s=0.0,
                                        check_ntt=False, clock=clock, kem=kem)
        return unshaped.link_s_median

    return await plan(asked, lambda: HandshakeModel(rate_Bps, latency_s, framing_bytes=HEADER_BYTES).link_s,
                      host_floor_s)


async def dilated_handshakes(sessions: int, *, rate_Bps: float, latency_s: float,
                             dilation: float | str = "auto", kem: str = DEFAULT_KEM) -> HandshakeReport:
    """`run_handshakes` at the dilation `handshake_dilation` takes for `dilation` (what the command and the
    candidate row run)."""
    planned = await handshake_dilation(dilation, rate_Bps=rate_Bps, latency_s=latency_s, kem=kem)
    return await run_handshakes(sessions, rate_Bps=rate_Bps, latency_s=latency_s, dilation=planned, kem=kem)


async def run_handshakes(sessions: int, *, rate_Bps: float, latency_s: float, check_ntt: bool = True,
                         dilation: SerialDilation = UNDILATED, clock: Clock | None = None,
                         kem: str = DEFAULT_KEM) -> HandshakeReport:
    """Run `sessions` handshakes over one loopback connection shaped at (rate_Bps, latency_s) each way, time
    dilated by `dilation` (the link at rate / D and latency × D; link times reported in model seconds), by the
    KEM named `kem` (kem.py)."""
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {sessions}")
    kem_name = kem
    kem_impl = load_kem(kem_name)
    clock = clock if clock is not None else MonotonicClock()
    d = dilation.dilation
    model = HandshakeModel(rate_Bps, latency_s, framing_bytes=HEADER_BYTES)
    server_secrets: list[bytes] = []
    received_eks: list[bytes] = []
    server_compute_ns: list[int] = []
    server_links: list[ShapedStreamWriter] = []

    async def serve(reader: asyncio.StreamReader, link: ShapedStreamWriter) -> None:
        server_links.append(link)
        while True:
            kind, ek = await read_message(reader, {KIND_EK: MLKEM768_EK_BYTES, KIND_BYE: 0}, "pqkex server")
            if kind == KIND_BYE:
                break
            received_eks.append(ek)
            start = clock.now_ns()
            secret, ciphertext = kem_impl.encaps(ek)
            server_compute_ns.append(clock.now_ns() - start)
            server_secrets.append(secret)
            await link.send(frame(KIND_CT, ciphertext))

    client_secrets: list[bytes] = []
    key_pairs: list[tuple[bytes, bytes]] = []
    link_s: list[float] = []
    compute_ns = 0
    async with shaped_loopback(serve, rate_Bps=rate_Bps / d, latency_s=latency_s * d, clock=clock) as connection:
        reader, link = connection.reader, connection.link
        for _ in range(sessions):
            start = clock.now_ns()
            ek, dk = kem_impl.keygen()
            keygen_ns = clock.now_ns() - start
            await link.send(frame(KIND_EK, ek))
            _, ciphertext = await read_message(reader, {KIND_CT: MLKEM768_CT_BYTES}, "pqkex client")
            decaps_start = clock.now_ns()
            client_secrets.append(kem_impl.decaps(dk, ciphertext))
            end = clock.now_ns()
            session_compute = keygen_ns + (end - decaps_start) + server_compute_ns[len(client_secrets) - 1]
            compute_ns += session_compute
            link_s.append((end - start - session_compute) / 1e9 / d)
            if not key_pairs:
                key_pairs.append((ek, dk))
        await link.send(frame(KIND_BYE, b""))
        await connection.served
    ntt, agrees = None, None
    reference = reference_kem() if check_ntt else None
    pair = kem_impl.reference_key_pair(received_eks[0], key_pairs[0][1]) if reference is not None else None
    if reference is not None and pair is not None:
        # The key the server received (what crossed the link) with the client's decapsulation key, in kyber-py's
        # expanded form.
        ntt, agrees = check_against_library(reference, received_eks[0], pair.dk), pair.agrees
    return HandshakeReport(
        sessions=sessions,
        secrets_equal=sum(a == b for a, b in zip(client_secrets, server_secrets, strict=True)),
        rate_Bps=rate_Bps, latency_s=latency_s,
        bytes_client_to_server=link.counters.wire_bytes - HEADER_BYTES,  # the closing Bye is not a handshake's
        bytes_server_to_client=server_links[0].counters.wire_bytes,
        elapsed_s=compute_ns / 1e9 + sum(link_s), compute_s=compute_ns / 1e9, link_s_per_session=link_s,
        modelled_link_s=model.link_s, ntt_check=ntt, dilation=dilation, kem=kem_name,
        kem_implementation=kem_impl.implementation, reference_agrees=agrees,
    )
