"""Sub-millisecond wake-ups for an event loop without spinning: one Linux timerfd per loop.

Both loops' own timers are millisecond-grained (asyncio's epoll selector rounds a timeout up to the next
millisecond; libuv counts its timers in milliseconds), so a deadline met to the microsecond used to need a
yield-spin over the last millisecond of every sleep (runtime/clock.py). A spinning process is a CPU hog in the
kernel scheduler's eyes: on two cores shared by four agents it is preempted mid-spin and wakes late, and it
delays everyone else's wake-ups, tc's softirqs included (benchmarks/RESULTS.md, Timers).

A timerfd armed at an absolute CLOCK_MONOTONIC deadline (the clock `time.monotonic_ns` reads on Linux) becomes
readable at that instant: an hrtimer, started without slack. The loop, blocked in epoll, wakes on it as on any
socket, so the process sleeps right up to its deadline. One fd serves every sleeper of a loop: it is armed for
the earliest deadline and re-armed as they pass.

Linux only (timerfd_create(2), through ctypes: `os.timerfd_create` arrives in Python 3.13). `for_running_loop()`
returns None elsewhere, and the clock falls back to the loop's timer and a longer spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import os
import sys
import time
import weakref

# <sys/timerfd.h> and <time.h> (Linux, all architectures):
_CLOCK_MONOTONIC = 1
_TFD_CLOEXEC = 0o2000000
_TFD_NONBLOCK = 0o4000
_TFD_TIMER_ABSTIME = 1
_NS_PER_S = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The running interpreter's own symbols (dlopen(NULL)), libc's among them: no ctypes.util.find_library,
        # which runs ldconfig in a child process on every import.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018 — raises AttributeError where the C library lacks it
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


class _Fd:
    """An fd closed exactly once, by whoever gets there first (close(), or the loop's finalizer)."""

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class PreciseTimer:
    """Wakes futures at absolute monotonic deadlines (ns) on one loop, through one timerfd."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL):
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self._fd = _Fd(fd)
        self._libc = libc
        # Weakly: the per-loop registry holds this timer, and a strong reference back would keep the loop alive.
        self._loop = weakref.ref(loop)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._armed_ns: int | None = None
        loop.add_reader(fd, self._fire)

    @property
    def fd(self) -> int:
        """The timerfd (-1 once closed)."""
        return self._fd.fd

    def wait_until(self, deadline_ns: int) -> asyncio.Future[None]:
        """A future the loop completes at `deadline_ns` (at once if that has passed)."""
        loop = self._loop()
        if loop is None or self.fd < 0:
            raise RuntimeError("this timer's loop is gone or the timer is closed")
        waiter: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiters, (deadline_ns, next(self._seq), waiter))
        if self._armed_ns is None or deadline_ns < self._armed_ns:
            self._arm(deadline_ns)
        return waiter

    @property
    def pending(self) -> int:
        return sum(1 for *_, waiter in self._waiters if not waiter.done())

    def _arm(self, deadline_ns: int) -> None:
        # An absolute deadline of 0 would disarm the timer: a deadline in the past is armed 1 ns in, which
        # has passed too, so the fd is readable at once.
        deadline_ns = max(deadline_ns, 1)
        value = _Itimerspec(_Timespec(0, 0), _Timespec(deadline_ns // _NS_PER_S, deadline_ns % _NS_PER_S))
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(value), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self._armed_ns = deadline_ns

    def _fire(self) -> None:
        # The expiry count: reading it clears readiness. Nothing to read means the fd was re-armed for later
        # since it became readable, and nothing is due yet.
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)
        now = time.monotonic_ns()
        while self._waiters and self._waiters[0][0] <= now:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():  # a cancelled sleeper left its future behind
                waiter.set_result(None)
        self._armed_ns = None
        if self._waiters:
            self._arm(self._waiters[0][0])

    def close(self) -> None:
        """Stop watching the fd and close it (the loop may already be closed)."""
        loop = self._loop()
        if self.fd >= 0 and loop is not None and not loop.is_closed():
            loop.remove_reader(self.fd)
        self._fd.close()


_TIMERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PreciseTimer] = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether this platform has timerfd (Linux)."""
    return _LIBC is not None


def for_running_loop() -> PreciseTimer | None:
    """The running loop's timer, made on first use and closed when the loop is collected (None off Linux)."""
    if _LIBC is None:
        return None
    loop = asyncio.get_running_loop()
    timer = _TIMERS.get(loop)
    if timer is None:
        timer = _TIMERS[loop] = PreciseTimer(loop, _LIBC)
        weakref.finalize(loop, timer._fd.close)
    return timer
