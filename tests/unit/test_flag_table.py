"""One flag vocabulary: docs/flags.md is what the parsers say, and a knob is spelled one way in every command."""

from __future__ import annotations

import pytest

from kvtransit.cli import build_parser
from kvtransit.cli.flag_table import flag_rows, flag_table
from kvtransit.paths import REPO

SIDE_COMMANDS = ("ring", "select", "collective", "weights")


def test_the_committed_flag_table_is_what_the_parsers_say():
    """docs/flags.md is `python -m kvtransit.cli.flag_table > docs/flags.md` (run it after changing a flag)."""
    assert (REPO / "docs" / "flags.md").read_text() == flag_table()


@pytest.mark.parametrize("command", SIDE_COMMANDS)
def test_a_side_command_takes_the_knobs_it_shares_with_up_under_ups_names(command):
    rows = {row.flag: row for row in flag_rows()}
    for flag in ("--device", "--policy", "--model"):
        assert command in rows[flag].commands, (command, flag)
    assert "--gpu" not in rows, "--gpu is an old spelling of --device, not a flag of its own"


@pytest.mark.parametrize("argv,dest,value", [
    (["ring", "--bits", "6"], "precision_bits", 6),
    (["ring", "--precision-bits", "6"], "precision_bits", 6),
    (["select", "--score-bits", "4"], "precision_bits", 4),
    (["ring", "--n", "8"], "ring_ranks", 8),
    (["ring", "--ring-ranks", "8"], "ring_ranks", 8),
    (["select", "--budget", "1/8"], "select_budget", 0.125),
    (["select", "--select-budget", "1/8"], "select_budget", 0.125),
    (["collective", "--gpu", "a100"], "device", "a100"),
    (["collective", "--link", "nvlink5"], "scaleup_link", "nvlink5"),
    (["weights", "--kernel", "zstd"], "codec", "zstd"),
    (["weights", "--codec", "zstd"], "codec", "zstd"),
    (["calc", "--budget", "low"], "budget", "low"),
    (["calc", "--module-budget", "0.8"], "budget", 0.8),
])
def test_an_old_spelling_still_sets_the_same_knob_for_one_release(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_a_side_commands_module_budget_reads_as_ups_a_name_or_a_number():
    assert build_parser().parse_args(["ring", "--module-budget", "2.5"]).module_budget == 2.5
    assert build_parser().parse_args(["select", "--module-budget", "low"]).module_budget == "low"


def test_a_bad_module_budget_is_one_line_naming_the_flag_and_the_valid_values(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["collective", "--module-budget", "lots"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--module-budget" in err and "low, sim, high or a number" in err
