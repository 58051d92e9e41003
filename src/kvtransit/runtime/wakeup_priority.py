"""Real-time priority for a timer's wake-up, not for the work after it.

A stepping agent's timer stands for GPU time: when it fires, the agent must run now, whatever the host's other
processes are doing. On this 2-core VM (Linux 6.18, EEVDF) a woken task at normal priority waited 2.6-4.0 ms for a
core while the middlebox finished its slice (`perf sched timehist`, a default `kvtransit up`): the prefill's step
timers woke that late at about half of its steps, 0.4-0.8 ms on average, 2-5 % of its shortest step against the
fidelity guard's 3 %, so the default run was faithful or not by chance. Niceness does not help (nice -10 left it
at 0.65 ms: EEVDF lets the running task finish its slice); SCHED_RR does (the same run: 0.9 us mean, 22 us worst).

Real-time priority for the whole process would also run its work ahead of everyone's (making 4 MB of KV frames,
reading a hand-off), and on two cores that starves the middlebox, whose timing is the link's. So a clock holds
it only around a deadline: from PROMOTE_LEAD_S before it, through the wake-up, until the sleeper returns, then
gives it back. Linux sets the policy per thread; the loop's thread is the one that sleeps.

Where the host does not allow it (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0: a container without the
capability), `probe` says why and timers run at normal priority; agents report which (`timer_priority`), and a
timer check that fails says so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

# SCHED_RR priority 1-99. Low: above every normal task, below the kernel's own real-time threads (threaded IRQs
# run at 50, watchdogs at 99), so a wake-up never delays the interrupts that deliver it.
RT_PRIORITY = 10
# How long before a deadline the sleeper takes real-time priority: longer than the wait it removes (a woken
# normal task waited up to 4.0 ms for a core here, above), so the wake-up at the start of the window is not the
# late one. Decode's steps (~6 ms at the default scenario) are inside it almost whole; the prefill's (17 ms and
# up) for their last 5 ms.
PROMOTE_LEAD_S = 5e-3

SchedSetter = Callable[[int, int, "os.sched_param"], None]
# Holders on this thread, whichever WakeupPriority they came through: agents run in one process (in-process tests)
# share the loop's thread, and one agent leaving its window must not take the priority from another still in its.
_THREAD = threading.local()


class WakeupPriority:
    """Takes and gives back real-time priority for the calling thread, counting nested holders on the thread
    (several tasks of one loop, or several agents on it, may be inside their windows at once: the last to leave
    gives it back)."""

    def __init__(self, priority: int = RT_PRIORITY, *, lead_s: float = PROMOTE_LEAD_S,
                 setter: SchedSetter | None = None):
        """`setter`: os.sched_setscheduler (injected in tests)."""
        if not 1 <= priority <= 99:
            raise ValueError(f"real-time priority must be 1-99, got {priority!r}")
        if not lead_s >= 0:
            raise ValueError(f"lead_s must be >= 0, got {lead_s!r}")
        self.priority = priority
        self.lead_ns = int(lead_s * 1e9)
        self._set = setter if setter is not None else os.sched_setscheduler
        self._holders = 0
        self.promotions = 0
        self.unavailable = ""  # why this thread may not take it (`probe`); then promote/demote are never called

    @property
    def available(self) -> bool:
        return not self.unavailable

    def describe(self) -> str:
        if self.unavailable:
            return f"normal: {self.unavailable}"
        return f"realtime (SCHED_RR {self.priority} from {self.lead_ns / 1e6:g} ms before each deadline)"

    @property
    def held(self) -> bool:
        return self._holders > 0

    def promote(self) -> None:
        count = getattr(_THREAD, "holders", 0)
        if count == 0:
            self._set(0, os.SCHED_RR, os.sched_param(self.priority))
            self.promotions += 1
        _THREAD.holders = count + 1
        self._holders += 1

    def demote(self) -> None:
        if self._holders <= 0:
            raise RuntimeError("demote without a matching promote")
        self._holders -= 1
        _THREAD.holders -= 1
        if _THREAD.holders == 0:
            self._set(0, os.SCHED_OTHER, os.sched_param(0))


def probe(priority: int = RT_PRIORITY, *, setter: SchedSetter | None = None) -> WakeupPriority:
    """A WakeupPriority for the calling thread, tried once (taken and given back): `available` when this host lets
    it take real-time priority, else `unavailable` says why (the timers then run at normal priority)."""
    wakeup = WakeupPriority(priority, setter=setter)
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_RR"):
        wakeup.unavailable = "this platform has no SCHED_RR"
        return wakeup
    try:
        wakeup.promote()
        wakeup.demote()
    except PermissionError:
        wakeup.unavailable = "no permission for SCHED_RR (root, CAP_SYS_NICE or RLIMIT_RTPRIO needed)"
    except OSError as exc:
        wakeup.unavailable = f"SCHED_RR refused ({exc.strerror or exc})"
    wakeup.promotions = 0
    return wakeup
