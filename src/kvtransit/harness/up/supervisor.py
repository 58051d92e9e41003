"""What the launcher's supervisor needs to restart a crashed middlebox or decode on the same ports.

`Launcher(restart_roles=("middlebox", ...))` restarts a child of those roles that exits mid-run: same argv, its
listening ports pinned to the ones it first announced (`pinned_argv`), at most MAX_RESTARTS times per child.
Peers recover on their own: the prefill reconnects to the middlebox and sends every unacked hand-off again;
the middlebox and the load generator dial a restarted decode again.

Listening sockets are bound with SO_REUSEADDR (asyncio's default on Unix), so the same port can be bound
again at once, even with the dead process's connections in TIME_WAIT.
"""

from __future__ import annotations

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
