"""Security basics: nothing evaluates data (from the wire or anywhere), and what listens binds to loopback by
default, with the control API's bearer token enforced when set."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvtransit.cli import build_parser

SRC = Path(__file__).resolve().parents[2] / "src" / "kvtransit"
# Deserialisers that can run code or build arbitrary objects from bytes: never imported by kvtransit.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}


def _calls_and_imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, "import", alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node, "import", node.module.split(".")[0]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                yield node, "call", func.id
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                yield node, "call", f"{func.value.id}.{func.attr}"


def test_no_source_file_evaluates_or_unpickles_data():
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, kind, name in _calls_and_imports(tree):
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            if kind == "import" and name in UNSAFE_MODULES:
                offences.append(f"{where} imports {name}")
            elif kind == "call" and (name in UNSAFE_BUILTINS or name in ("yaml.load", "yaml.unsafe_load")):
                offences.append(f"{where} calls {name}")
            elif kind == "call" and name in ("np.load", "numpy.load"):
                pickle_flag = [k for k in node.keywords if k.arg == "allow_pickle"]
                if not pickle_flag or not (isinstance(pickle_flag[0].value, ast.Constant)
                                           and pickle_flag[0].value.value is False):
                    offences.append(f"{where} calls np.load without allow_pickle=False")
            elif kind == "call" and name.startswith("subprocess.") and any(
                    k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in node.keywords):
                offences.append(f"{where} runs a shell")
    assert offences == []


def test_the_scan_would_see_an_offence():
    tree = ast.parse("import pickle\nx = eval(data)\nimport numpy as np\nnp.load(p)\n")
    found = {name for _, _, name in _calls_and_imports(tree)}
    assert {"pickle", "eval", "np.load"} <= found


LISTEN_FLAGS = ("--listen", "--metrics-listen", "--control-listen", "--client-listen")


@pytest.mark.parametrize("command", ["prefill", "middlebox", "decode", "loadgen"])
def test_every_agent_listens_on_loopback_unless_told_otherwise(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    defaults = {a.option_strings[0]: a.default for a in sub._actions if a.option_strings
                and a.option_strings[0] in LISTEN_FLAGS}
    assert defaults, f"{command} has no listening flags?"
    for flag, value in defaults.items():
        assert value.startswith("127.0.0.1:"), f"kvtransit {command} {flag} defaults to {value}"


async def test_the_control_api_requires_its_bearer_token_and_metrics_stay_public():
    from prometheus_client import CollectorRegistry

    from kvtransit.agents.middlebox.app import Middlebox
    from kvtransit.agents.middlebox.control import register_control_routes
    from kvtransit.model.scenario import Scenario
    from kvtransit.runtime.http import HttpServer
    from kvtransit.runtime.http_client import request as http_call

    registry = CollectorRegistry()
    middlebox = Middlebox(Scenario(codec="none"), [("127.0.0.1", 9)], registry=registry)
    http = HttpServer(registry=registry, token="s3cret")
    register_control_routes(http, middlebox)
    await http.start()
    try:
        assert http.host == "127.0.0.1"
        body = b'{"type": "latency"}'
        assert (await http_call(http.host, http.port, "PUT", "/faults/x", body)).status == 401
        assert (await http_call(http.host, http.port, "PUT", "/faults/x", body,
                                headers={"Authorization": "Bearer wrong"})).status == 401
        assert middlebox.faults.describe() == []
        assert (await http_call(http.host, http.port, "PUT", "/faults/x", body,
                                headers={"Authorization": "Bearer s3cret"})).status == 200
        assert (await http_call(http.host, http.port, "GET", "/metrics")).status == 200
    finally:
        await http.close()
        await middlebox.close()
