"""`kvtransit collective`: bad groups are refused with one line naming the valid values, before any process starts."""

import pytest

from kvtransit.cli import main


@pytest.mark.parametrize("argv, expected", [
    (["--tp", "3"], "TP 3 does not divide llama3-70b's 64 heads (valid: 1, 2, 4, 8, 16, 32, 64)"),
    (["--ep", "2"], "EP needs a mixture-of-experts model; llama3-70b is dense"),
    (["--model", "mixtral-8x7b", "--ep", "2", "--allreduce", "switch"], "--allreduce ring (valid: ring)"),
    (["--tp", "4", "--scale", "2"], "scale must be in (0, 1], got 2.0"),
    (["--model", "mixtral-8x7b", "--ep", "2", "--dispatch", "fp8", "--dispatch-at", "transit"],
     "FP8 dispatch refused in transit: it needs rounding, which the module (qsfp56) does not publish"),
    (["--tp", "4", "--dispatch", "fp8"], "--dispatch fp8 needs an all-to-all: expert parallelism (--ep 2"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    assert main(["collective", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert len(err.strip().splitlines()) == 1
