"""The `--tp-group JSON` flag of a prefill or decode that leads a TP group (`kvtransit up` gives it: the group's
follower ranks' ports and the switch's; flows/tp/group/leader.py: LeaderConfig), and the `--ring-group JSON` flag
of a prefill that leads a ring (its follower ranks' ports; flows/ring/group.py: RingGroupConfig)."""

from __future__ import annotations

import argparse
import json


def add_tp_group_flag(parser: argparse.ArgumentParser, role: str) -> None:
    parser.add_argument("--tp-group", default="", metavar="JSON",
                        help=f"with --{role}-tp N > 1: the group this {role} leads as rank 0, its N - 1 follower "
                             "ranks' ports and the switch's (`kvtransit up` starts them and gives this)")


def tp_group_config(text: str, flag: str, size: int):
    """The group to lead, given exactly when `size` > 1; a bad one is one line naming the flag."""
    from kvtransit.cli._common import CliError
    from kvtransit.flows.tp.group.leader import LeaderConfig

    if size == 1:
        if text:
            raise CliError(f"--tp-group: given with {flag} 1 (one GPU has no group to lead)")
        return None
    if not text:
        raise CliError(f"--tp-group: {flag} {size} needs the group's followers (kvtransit up starts them and passes "
                       "this flag)")
    try:
        return LeaderConfig(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise CliError(f"--tp-group: {exc}") from None


def add_ring_group_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ring-group", default="", metavar="JSON",
                        help="with --ring-share > 0: the ring this prefill leads as rank 0, its n - 1 follower ranks' "
                             "ports (`kvtransit up` starts them and gives this)")


def ring_group_config(text: str, ring_share: float):
    """The ring to lead, given exactly when the run has a ring class; a bad one is one line naming the flag."""
    from kvtransit.cli._common import CliError
    from kvtransit.flows.ring.group import RingGroupConfig

    if not ring_share:
        if text:
            raise CliError("--ring-group: given with --ring-share 0 (no ring request to lead a ring for)")
        return None
    if not text:
        raise CliError("--ring-group: --ring-share > 0 needs the ring's followers (kvtransit up starts them and "
                       "passes this flag)")
    try:
        return RingGroupConfig(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise CliError(f"--ring-group: {exc}") from None
