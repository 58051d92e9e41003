"""Restart a crashed middlebox or decode on the same ports, so the peers that dial it find it again.

`SupervisingLauncher` is `kvtransit up`'s Launcher with a supervisor: a child of a restartable role that
exits while the run is on is started again (same argv, its ports pinned to the ones it announced), at most
MAX_RESTARTS times per child; any other exit is a crash, as in the plain Launcher. Peers recover on their
own: the prefill reconnects to the middlebox and sends every unacked hand-off again, the middlebox and the
load generator dial a restarted decode again.

Listening sockets are bound with SO_REUSEADDR (asyncio's default on Unix), so the same port can be bound
again at once, even with the dead process's connections in TIME_WAIT.
"""

from __future__ import annotations

import asyncio
import time

from .launcher import Child, Launcher

RESTARTABLE_ROLES = ("middlebox", "decode")
# A child that keeps dying is a bug, not a fault to ride out: after this many restarts it is a crash.
MAX_RESTARTS = 5
# What a port-0 flag becomes on a restart: the port the first start announced (its KVTRANSIT-READY key).
PORT_FLAGS = {"--listen": "listen_port", "--control-listen": "control_port", "--metrics-listen": "metrics_port",
              "--client-listen": "client_port"}


def pinned_argv(argv: list[str], ready: dict) -> list[str]:
    """`argv` with every listening flag's port set to the one `ready` announced (the host is kept)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        key = PORT_FLAGS.get(arg)
        if key is not None and key in ready:
            host, _, _ = out[i + 1].rpartition(":")
            out[i + 1] = f"{host}:{ready[key]}"
    return out


class SupervisingLauncher(Launcher):
    def __init__(self, *args, restart_roles: tuple[str, ...] = RESTARTABLE_ROLES, **kwargs):
        super().__init__(*args, **kwargs)
        self.restart_roles = restart_roles
        self.restarts: list[dict] = []  # {"name", "exited_at", "ready_at"}: monotonic seconds

    def current(self, role: str) -> Child:
        """The live (latest) child of a role."""
        return [c for c in self.children if c.role == role][-1]

    async def _restart(self, child: Child) -> Child:
        exited_at = time.monotonic()
        fresh = Child(child.name, child.role, pinned_argv(child.argv, child.ready), host=child.host,
                      kv_host=child.kv_host)
        self.log(f"kvtransit up: {child.describe_exit()}\nkvtransit up: restarting {child.name} on the same ports")
        await self._start(fresh)
        self.restarts.append({"name": child.name, "exited_at": exited_at, "ready_at": time.monotonic()})
        return fresh

    async def _supervise(self, loadgen: Child, stop: asyncio.Event) -> None:
        waits = {asyncio.create_task(c.process.wait()): c for c in self.children}
        stopper = asyncio.create_task(stop.wait())
        try:
            while True:
                done, _ = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    return
                for task in done:
                    child = waits.pop(task)
                    if child is loadgen:
                        return
                    restarted = sum(1 for r in self.restarts if r["name"] == child.name)
                    if child.role in self.restart_roles and restarted < MAX_RESTARTS and not stop.is_set():
                        fresh = await self._restart(child)
                        waits[asyncio.create_task(fresh.process.wait())] = fresh
                        continue
                    self.crashed = child
                    self.log(f"kvtransit up: {child.describe_exit()}\nkvtransit up: stopping the run; the report "
                             "will hold what completed")
                    return
        finally:
            stopper.cancel()
            for task in waits:
                task.cancel()
