"""The Prometheus config and rules in prometheus/ are what promtool accepts (the same files both testbeds use)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(shutil.which("promtool") is None,
                       reason="promtool not on PATH (apt-get install prometheus)"),
]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_config_with_its_rules_and_targets():
    done = _promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    # The config must really load the rule files (a glob matching nothing is valid but useless).
    assert f"{len(RULE_FILES)} rule files found" in done.stdout + done.stderr


def test_promtool_accepts_every_rule_file():
    assert {p.name for p in RULE_FILES} >= {"recording.yml", "alerts.yml"}
    done = _promtool("check", "rules", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rejects_a_broken_rule(tmp_path):
    """The check can fail: a rule with a PromQL syntax error is refused."""
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - record: a:b:c\n        expr: sum(rate(x[30s])\n")
    assert _promtool("check", "rules", str(bad)).returncode != 0
