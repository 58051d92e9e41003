"""`kvtransit up --kernel FILE` runs the declared kernel, live on loopback as test_module_flags_live.py.

The deck's sketch (examples/kernels/freq-keep-half.toml: FFT of length 64, keep half, 8-bit analogue path) maps to
band-keep, fft variant, block 64, keep 0.5, precision_bits 8. The processes get the mapped flags
(`Scenario.to_argv()`), never the file: the file is deleted before the run starts, and the middlebox still runs
the sketch's kernel. Light: a handful of short requests, no accuracy sampling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.harness.up.launcher import Launcher

pytestmark = pytest.mark.timeout(180)

SKETCH_FILE = Path(__file__).resolve().parents[2] / "examples" / "kernels" / "freq-keep-half.toml"
LIGHT = ["--requests", "6", "--rate", "1", "--prompt-mean", "256", "--output-mean", "16"]


@pytest.fixture(scope="module")
def sketch_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel-file")
    kernel_file = tmp / "freq-keep-half.toml"
    shutil.copy(SKETCH_FILE, kernel_file)
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(["--kernel", str(kernel_file), *LIGHT]))
    kernel_file.unlink()  # the processes must not need it
    launcher = Launcher(scenario, report_path=tmp / "report.json", drain_timeout_s=20.0, accuracy_sample=0,
                        figures=False, log=lambda _msg: None)
    path = asyncio.run(launcher.run())
    assert path is not None
    return kernel_file, json.loads(path.read_text())


def test_every_request_of_the_declared_kernels_run_completes(sketch_run):
    _, report = sketch_run
    req = report["requests"]
    assert req["failed"] == 0 and req["timed_out"] == 0 and req["total"] == 6, req


def test_the_middlebox_runs_the_mapped_kernel_without_the_file(sketch_run):
    _, report = sketch_run
    middleboxes = [a for a in report["run"]["agents"] if a.get("role") == "middlebox"]
    assert middleboxes, [a.get("role") for a in report["run"]["agents"]]
    kernel = middleboxes[0]["chain"][0]
    assert (kernel["stage"], kernel["codec"], kernel["variant"], kernel["block"], kernel["keep"],
            kernel["precision_bits"], kernel["transform_charged"], kernel["runs"]) == (
        "kernel", "freq-keep-k", "fft", 64, 0.5, 8, False, "module")


def test_the_report_says_which_kernel_file_was_run(sketch_run):
    kernel_file, report = sketch_run
    config = report["config"]
    assert config["kernel_file"] == str(kernel_file)
    assert (config["codec"], config["variant"], config["precision_bits"], config["codec_ratio"]) == (
        "freq-keep-k", "fft", 8, 2.0)


def test_up_refuses_a_flag_that_contradicts_the_kernel_in_one_line():
    result = subprocess.run([sys.executable, "-m", "kvtransit.cli", "up", "--kernel", str(SKETCH_FILE),
                             "--codec", "fp8"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"kvtransit up: error: --kernel {SKETCH_FILE} sets --codec freq-keep-k, but "
                                     "--codec fp8 was given too: drop one")
