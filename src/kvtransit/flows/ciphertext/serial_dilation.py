"""The dilation a serial flow runs at (a key exchange's handshakes, an encrypted layer's requests), and why.

Such a flow's link times are tens of microseconds to a millisecond (an ML-KEM-768 handshake over eth-25g: 41 µs),
while the host's own cost of a message (framing, the socket, the loop's wake-up, copying a ciphertext) is of the
same order and adds to every link time measured: at dilation 1 the handshake's link time read +156 % off the
model here. `plan` measures that cost on this host (the same messages over an unshaped link, `UNSHAPED_RATE_BPS`)
and takes the least dilation that makes it at most `SERIAL_SHARE` of the modelled link time
(model/kv_scale.py: `serial_dilation`); a number asked for is taken as it is.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvtransit.model.judge.fidelity import GROUP_TOLERANCE
from kvtransit.model.kv_scale import resolve_dilation, serial_dilation

# 1 PB/s: a 331 kB CKKS ciphertext serialises in 0.3 ns, so a run at this rate with no latency measures the host.
UNSHAPED_RATE_BPS = 1e15
# Half the live groups' band around the model (model/judge/fidelity.py: GROUP_TOLERANCE, 5 %), so the host's cost
# leaves the other half to the run's noise.
SERIAL_SHARE = GROUP_TOLERANCE / 2


@dataclass(frozen=True)
class SerialDilation:
    dilation: float
    why: str
    host_floor_s: float | None = None  # the host's cost of one event, measured (None: not measured, asked for)
    modelled_s: float | None = None  # the event's modelled link time it was weighed against

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


UNDILATED = SerialDilation(1.0, "asked for")  # a flow run as it is, at the link's own rate


def dilation_arg(text: str) -> float | str:
    """`--dilation` of a serial flow's command: "auto" or a number >= 1."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'auto'") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a dilation must be >= 1 (or auto)")
    return value


async def plan(asked: float | str, modelled_s: Callable[[], float],
               measure_floor: Callable[[], Awaitable[float]]) -> SerialDilation:
    """`asked` ("auto" or a number ≥ 1). Under auto, `measure_floor()` runs the flow on an unshaped link and
    returns the host's cost of one event (seconds); `modelled_s()` is that event's link time on the real link
    (called after the measurement, which may be what tells its size)."""
    if asked != "auto":
        dilation, why = resolve_dilation(asked, 1.0)
        return SerialDilation(dilation, "asked for")
    floor_s = await measure_floor()
    model_s = modelled_s()
    dilation = serial_dilation(model_s, floor_s, SERIAL_SHARE)
    why = (f"auto: the host's {floor_s * 1e6:,.0f} µs an event (measured unshaped) within {SERIAL_SHARE:.1%} of "
           f"a modelled {model_s * 1e6:,.0f} µs of link")
    return SerialDilation(dilation, why, floor_s, model_s)
