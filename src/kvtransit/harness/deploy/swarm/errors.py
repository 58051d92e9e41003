"""The two ways a swarm run can fail, each said in one line."""

from __future__ import annotations

from kvtransit.model.errors import ConfigError


class SwarmUnavailable(ConfigError):
    """This engine or swarm cannot run the stack as asked (not a manager, labels missing, an old engine); nothing
    was deployed. The message says what to do."""


class StackRunFailed(Exception):
    """The stack was deployed and did not produce a run (a service never became healthy, the load generator
    failed, no report); the message names the service and quotes its error. The stack is removed all the same."""
