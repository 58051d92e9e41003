"""Placement is a property of the middlebox process: a pluggable sees one stream and refuses a kernel
that combines streams (at start, in the declaration check, on a live PUT /kernel: 400, nothing changed) with
placement_check's reason; a switch runs the stream sum, its declared kernel checked; bad input is one line naming
what was wrong."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.control import register_control_routes
from kvtransit.cli import main
from kvtransit.flows.tp.run import plan_collective, switch_argv
from kvtransit.flows.tp.switch.kernel_check import check_switch_kernel, placement_refusal
from kvtransit.flows.tp.switch.process import SwitchConfig
from kvtransit.kernels.stream_sum import declaration as sum_declaration
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module, Verdict
from kvtransit.model.module.kernel_file import load_kernel_declaration
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.http import HttpServer

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "kernels"
SUM4_SWITCH = EXAMPLES / "sum-four-streams.toml"
SUM4_PLUGGABLE = EXAMPLES / "sum-four-streams-pluggable.toml"
ON_PLUGGABLE = "needs 4 streams but a pluggable sees 1 stream (place it on a switch)"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# --- the declaration check ---------------------------------------------------------------------------------------

def test_the_declared_sum_passes_its_checks_on_a_switch_and_is_refused_on_a_pluggable_with_the_reason(capsys):
    status, out, _ = run_cli(capsys, "kernels", "--json", "--budget", "sim", "--declare", str(SUM4_SWITCH),
                             "--declare", str(SUM4_PLUGGABLE))
    assert status == 0
    on_switch, on_pluggable = json.loads(out)["kernels"][-2:]
    assert on_switch["checks"]["placement"]["ok"] and on_switch["checks"]["placement"]["streams_needed"] == 4
    assert (on_switch["verdict"], on_switch["action"]) == ("fits", "in-transit")
    assert (on_pluggable["verdict"], on_pluggable["action"]) == ("misplaced", "rejected")
    assert on_pluggable["checks"]["placement"]["text"] == ON_PLUGGABLE


def test_the_two_example_files_declare_the_same_sum_but_for_the_placement():
    on_switch, on_pluggable = load_kernel_declaration(SUM4_SWITCH), load_kernel_declaration(SUM4_PLUGGABLE)
    assert replace(on_pluggable, name=on_switch.name, placement="switch") == on_switch
    assert replace(sum_declaration(4), name=on_switch.name) == on_switch  # the switch's own sum, as a file


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_switch_runs_the_stream_sum_of_its_group(n):
    verdict = check_switch_kernel(sum_declaration(n), n, "switch", Module())
    assert verdict.verdict is Verdict.FITS  # 0.50 op/B <= the simulator's 1.6


def test_the_placement_judged_is_the_process_s_not_the_file_s():
    # A file that says switch, on a middlebox started as a pluggable: refused, with placement_check's reason.
    decl = load_kernel_declaration(SUM4_SWITCH)
    assert placement_refusal(decl, "pluggable") == f"kernel 'sum-four-streams': {ON_PLUGGABLE}"
    assert placement_refusal(decl, "switch") is None
    with pytest.raises(ConfigError, match=r"needs 4 streams but a pluggable sees 1 stream \(place it on a switch\)"):
        check_switch_kernel(decl, 4, "pluggable", Module())


@pytest.mark.parametrize("change,message", [
    ({"streams": 2, "ratio": 2.0}, "combines 2 streams, but the switch serves a group of 4"),
    ({"ratio": 2.0}, "ratio 2 contradicts a sum of 4 streams"),
    ({"ops_per_byte": 0.25}, "ops_per_byte 0.25, but the switch charges the sum 0.5 op per input byte"),
    ({"op_types": frozenset({"mac"})}, "op_types \\['mac'\\] lack 'float'"),
    ({"op_types": frozenset({"float", "topk"})}, "refused by the module: not allowed \\(needs topk"),
    ({"transform": "fft", "transform_length": 64, "op_types": frozenset({"fft", "float"})},
     "transform 'fft': the switch runs the stream sum only"),
])
def test_a_declaration_that_is_not_the_switch_s_sum_is_refused_naming_what_to_declare(change, message):
    decl = replace(load_kernel_declaration(SUM4_SWITCH), **change)
    with pytest.raises(ConfigError, match=message):
        check_switch_kernel(decl, 4, "switch", Module())


# --- the CLI: refused at start -------------------------------------------------------------------------------------

def test_a_pluggable_middlebox_refuses_at_start_a_kernel_file_that_combines_streams(capsys):
    status, _, err = run_cli(capsys, "middlebox", "--decode", "127.0.0.1:9", "--kernel", str(SUM4_PLUGGABLE))
    assert status == 2
    assert f"--kernel {SUM4_PLUGGABLE}: kernel 'sum-four-streams-pluggable': {ON_PLUGGABLE}" in err
    assert "this middlebox's --placement is pluggable" in err


def test_a_switch_file_on_a_middlebox_told_pluggable_is_refused_at_start(capsys):
    status, _, err = run_cli(capsys, "middlebox", "--placement", "pluggable", "--kernel", str(SUM4_SWITCH))
    assert status == 2 and ON_PLUGGABLE in err


def test_a_pluggable_refuses_to_serve_a_group_of_ranks(capsys):
    status, _, err = run_cli(capsys, "middlebox", "--ranks", "2")
    assert status == 2
    assert "kernel 'all-reduce-sum': needs 2 streams but a pluggable sees 1 stream (place it on a switch)" in err


@pytest.mark.parametrize("argv,message", [
    (["--placement", "switch", "--ranks", "1"], "--ranks: a switch sums at least 2 ranks' streams, got 1"),
    (["--placement", "switch", "--ranks", "2", "--kernel", str(SUM4_SWITCH)],
     "combines 4 streams, but the switch serves a group of 2"),
    (["--placement", "switch", "--ranks", "2", "--decode", "127.0.0.1:9"], "--decode: a switch serving a TP group"),
    (["--placement", "switch", "--ranks", "2", "--switch-config", "{"], "--switch-config: not valid JSON"),
    (["--placement", "switch", "--ranks", "2", "--switch-config", "[1]"], "expected a JSON object, got list"),
    (["--placement", "switch", "--ranks", "2", "--switch-config", '{"rate": 1}'],
     "switch config: unknown key 'rate' (keys: group, size, rate_Bps"),
    (["--placement", "switch", "--ranks", "2", "--switch-config", '{"size": 4}'],
     "--switch-config: size 4 contradicts --ranks 2"),
    (["--placement", "switch", "--ranks", "2", "--switch-config", '{"rate_Bps": -1}'],
     "switch config: rate_Bps must be a finite number > 0, got -1"),
    (["--placement", "switch", "--ranks", "2", "--group", "-1"], "switch config: group must be an integer in"),
    ([], "--decode: the KV hand-off needs the decode instances' addresses"),
])
def test_bad_middlebox_input_is_one_line_naming_what_was_wrong(capsys, argv, message):
    status, _, err = run_cli(capsys, "middlebox", *argv)
    assert status == 2
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("key,value,message", [
    ("size", 1, "size must be an integer in 2..65535, got 1"),
    ("scale", 2.0, "scale must be in (0, 1], got 2.0"),
    ("latency_s", float("nan"), "latency_s must be a finite number >= 0"),
    ("deadline_s", True, "deadline_s must be a finite number > 0, got True"),
    ("collectives", 1.5, "collectives must be an integer in"),
])
def test_a_bad_switch_config_value_is_refused_by_name(key, value, message):
    defaults = {"group": 1, "size": 2, "rate_Bps": 1e9, "latency_s": 0.0, "module_ops_per_byte": 1.6,
                "module_latency_s": 1e-6, "module_pj_per_bit": 1.0}
    with pytest.raises(ConfigError) as caught:
        SwitchConfig.from_mapping({key: value}, defaults)
    assert message in str(caught.value)


def test_kvtransit_collective_starts_its_switch_as_the_middlebox_at_placement_switch():
    plan = plan_collective(MODELS["llama3-70b"], DEVICES["h100"], LINKS["nvlink4"], tp=4, allreduce="switch",
                           steps=2, scale=0.01, dilation=10)
    argv = switch_argv(plan)
    assert argv[:8] == ["-m", "kvtransit.cli", "middlebox", "--placement", "switch", "--ranks", "4", "--group"]
    config = json.loads(argv[argv.index("--switch-config") + 1])
    assert (config["rate_Bps"], config["module_ops_per_byte"]) == (plan.rate_Bps, plan.module.ops_per_byte)
    assert SwitchConfig.from_mapping(config, {"group": 1, "size": 4}).size == 4  # every key one the switch takes


# --- the control API: a live PUT is refused, nothing changed --------------------------------------------------------

async def _put(middlebox: Middlebox, body: dict) -> tuple[int, object, object]:
    """PUT /kernel over real loopback HTTP; (status, answer, the chain as GET /chain shows it after)."""
    http = HttpServer()
    register_control_routes(http, middlebox)
    await http.start("127.0.0.1", 0)
    try:
        async def call(method: str, path: str, data: bytes = b"") -> tuple[int, object]:
            reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + data)
            await writer.drain()
            answer = await reader.read()
            writer.close()
            head, _, payload = answer.partition(b"\r\n\r\n")
            return int(head.split()[1]), json.loads(payload)

        status, answer = await call("PUT", "/kernel", json.dumps(body).encode())
        _, chain = await call("GET", "/chain")
        return status, answer, chain
    finally:
        await http.close()
        await middlebox.close()


@pytest.mark.parametrize("placement,reason", [
    ("pluggable", ("kernel 'fp8' refused: needs 2 streams but a pluggable sees 1 stream (place it on a switch); "
                   "this middlebox is a pluggable")),
    ("switch", ("kernel 'fp8' refused: it combines 2 streams, and this middlebox carries the KV hand-off, one "
                "stream per hand-off; a sum of 2 streams runs on the switch role (kvtransit middlebox --placement "
                "switch --ranks 2)")),
])
async def test_a_live_put_of_a_kernel_that_combines_streams_is_a_400_and_changes_nothing(placement, reason):
    middlebox = Middlebox(Scenario(codec="none", placement=placement), [("127.0.0.1", 9)])
    before = middlebox.describe_chain()
    status, answer, chain = await _put(middlebox, {"codec": "fp8", "streams": 2, "placement": "switch"})
    assert status == 400
    assert reason in json.dumps(answer)
    assert chain == before


async def test_a_live_put_of_one_stream_is_taken_as_before():
    middlebox = Middlebox(Scenario(codec="none"), [("127.0.0.1", 9)])
    status, answer, chain = await _put(middlebox, {"codec": "freq-keep-k", "streams": 1})
    assert status == 200 and chain == answer
    assert chain[0]["codec"] == "freq-keep-k" and "streams" not in chain[0]


@pytest.mark.parametrize("value", [0, -3, 2.0, "2", True])
async def test_a_put_with_a_bad_streams_value_is_a_400_naming_it(value):
    middlebox = Middlebox(Scenario(codec="none"), [("127.0.0.1", 9)])
    before = middlebox.describe_chain()
    status, answer, chain = await _put(middlebox, {"streams": value})
    assert status == 400 and "streams" in json.dumps(answer)
    assert chain == before
