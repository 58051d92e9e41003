"""Every query of every dashboard panel returns data from a real Prometheus scraping a real `kvtransit up` run
(with the shared KV pool: its row reads the pool's, the middlebox's pool path's and the prefix cache's series; with
the real model reading the first requests' KV, for the Fidelity dashboard's real-model panels; and with decode a TP
group of 2 whose all-reduce goes through a switch, for the Collectives row). The Remote KV row's and the Ring
attention row's queries are read from a second run, with remote KV (`--kv-placement remote`), which a decode TP group
does not combine with, and a ring class (`--ring-share`), which a prefix workload does not.

The run is short and the queries are polled while it runs (its Prometheus stops with it): a query passes once
it has returned at least one real number (not an empty result, not only NaN). Skips only when `prometheus` is
not on PATH; anything else that keeps a query empty (a metric the agents never export, a label child never
created, a broken recording rule) fails here, naming the panel.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dashboards.queries import PanelQuery, all_queries, metric_names
from kvtransit.harness.up.prometheus import ANNOUNCE_PREFIX

pytestmark = [
    pytest.mark.system,
    pytest.mark.shares_host,  # every query answered by a real Prometheus: what, not how fast
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus not on PATH (apt-get install prometheus)"),
]

# A short run at a rate the 2-core box carries (about 15 s of arrivals, 1 s scrapes, 30 s rate windows), with the
# shared KV pool, so the KV pool row's panels have data too: prompts share one of two 1,024-token system prompts
# (two 512-token blocks each), written back by the first request that computes them and fetched by the rest.
RUN_FLAGS = ["--requests", "40", "--rate", "3", "--prompt-mean", "512", "--output-mean", "32", "--seed", "7",
             "--kv-pool", "pool", "--prefix-workload", "system-prompts", "--system-prompts", "2",
             "--system-prompt-tokens", "1024", "--decode-tp", "2", "--allreduce", "switch"]
# The real model reads the first two requests' KV (`--kv-sample real --accuracy model`, the realkv extra that CI
# installs), so the Fidelity dashboard's real-model panels have data too.
REAL_MODEL_FLAGS = ["--kv-sample", "real", "--accuracy", "model", "--real-kv-requests", "2"]
# The Remote KV and Ring attention rows: a second short run, every other request attending to an 8k-token context
# held in the pool, and a quarter of them a 4k-token prompt that a ring of 2 prefills.
SECOND_RUN_FLAGS = ["--requests", "24", "--rate", "2", "--prompt-mean", "512", "--output-mean", "32", "--seed", "7",
                    "--kv-pool", "pool", "--kv-placement", "remote", "--remote-context", "8192", "--link", "eth-100g",
                    "--codec", "none", "--ring-share", "0.25", "--ring-ranks", "2", "--ring-prompt", "4096"]
SECOND_RUN_METRICS = ("kvtransit_remote_kv_", "kvtransit_ring_")
RUN_TIMEOUT_S = 240.0
POLL_INTERVAL_S = 1.0


def _query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=5) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise AssertionError(f"{expr}: {body}")
    return body["data"]["result"]


def _has_a_number(result: list[dict]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def _reads_the_second_run(query: PanelQuery) -> bool:
    return any(name.startswith(SECOND_RUN_METRICS) for name in metric_names(query.expr))


def test_every_dashboard_query_returns_data_from_a_real_run(tmp_path: Path):
    queries = [q for q in all_queries() if not _reads_the_second_run(q)]
    assert queries, "no dashboards under dashboards/json"
    _answered_by_a_run(tmp_path, [*RUN_FLAGS, *REAL_MODEL_FLAGS], queries)


def test_every_remote_kv_and_ring_query_returns_data_from_a_real_run(tmp_path: Path):
    queries = [q for q in all_queries() if _reads_the_second_run(q)]
    for prefix in SECOND_RUN_METRICS:
        assert sum(any(n.startswith(prefix) for n in metric_names(q.expr)) for q in queries) >= 4, \
            f"the Agents dashboard's row of {prefix}* is gone"
    _answered_by_a_run(tmp_path, SECOND_RUN_FLAGS, queries)


def _answered_by_a_run(tmp_path: Path, flags: list[str], queries: list[PanelQuery]) -> None:
    argv = [sys.executable, "-m", "kvtransit.cli", "up", *flags, "--prometheus", "--no-progress", "--no-figures",
            "--report", str(tmp_path / "report.json")]
    run = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    stdout_lines: list[str] = []
    url_found = threading.Event()
    url: list[str] = []

    def read_stdout():
        for line in run.stdout:
            stdout_lines.append(line)
            if line.startswith(ANNOUNCE_PREFIX + " "):
                url.append(json.loads(line.split(" ", 1)[1])["url"])
                url_found.set()

    stderr_lines: list[str] = []  # read all along, so a chatty run never blocks on a full pipe
    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: stderr_lines.extend(run.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    answered: set[PanelQuery] = set()
    errors: dict[PanelQuery, str] = {}
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not url_found.is_set() and run.poll() is None and time.monotonic() < deadline:
            url_found.wait(0.2)
        assert url, (f"`kvtransit up --prometheus` printed no {ANNOUNCE_PREFIX} line (exit {run.poll()}); "
                     f"stdout: {''.join(stdout_lines)[-2000:]} stderr: {''.join(stderr_lines)[-2000:]}")
        while run.poll() is None and time.monotonic() < deadline and len(answered) < len(queries):
            for query in queries:
                if query in answered:
                    continue
                try:
                    if _has_a_number(_query(url[0], query.expr)):
                        answered.add(query)
                        errors.pop(query, None)
                except (OSError, AssertionError) as exc:  # Prometheus gone (the run ended) or a bad query
                    errors[query] = str(exc)
            time.sleep(POLL_INTERVAL_S)
    finally:
        if run.poll() is None:
            # All queries answered before the run ended: stop it the way Ctrl-C does (it stops its children).
            os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for reader in readers:
            reader.join(timeout=5)
        run.stdout.close()  # (a ResourceWarning otherwise: Popen's pipes outlive the process)
        run.stderr.close()
    missing = [f"{q}{'  (' + errors[q] + ')' if q in errors else ''}" for q in queries if q not in answered]
    assert not missing, (f"{len(missing)} of {len(queries)} dashboard queries never returned data:\n"
                         + "\n".join(missing))
