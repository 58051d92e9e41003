"""A sweep point's result on its pod's log, and the logs gathered back into a local sweep's results file.

A pod prints one block per point (whatever else the log holds around it is ignored):

    KVTRANSIT-SWEEP-POINT-BEGIN {"sweep": "…", "index": 3, "of": 12, "key": "rate=8", "out": "/var/lib/…"}
    {"row": {...the results row...}, "files": {"points/rate=8.json": "...the report's text...", ...}}
    KVTRANSIT-SWEEP-POINT-END 3

`collect` reads every file of a directory of logs (`kubectl logs` of each pod, any names), checks that the blocks
belong to one sweep and agree where they repeat, writes each point's report where a local sweep puts it
(OUT/points/…), rewrites the row's report path to match, and adds the rows in index order to OUT's ResultsStore:
the very writer of a local sweep, so results.json and results.csv come out byte for byte as a local sweep of the
same rows writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kvtransit.harness.studies.sweep.runner import ResultsStore
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

BEGIN = "KVTRANSIT-SWEEP-POINT-BEGIN "
END = "KVTRANSIT-SWEEP-POINT-END "
# The environment variable an Indexed Job gives each pod (its completion index).
INDEX_ENV = "JOB_COMPLETION_INDEX"


def completion_index(environ: dict[str, str] | None = None) -> int:
    text = (os.environ if environ is None else environ).get(INDEX_ENV)
    if text is None or not text.isdigit():
        raise ConfigError(f"--run-point: no completion index in ${INDEX_ENV} (got {text!r}); it runs in a pod of the "
                          "Indexed Job `kvtransit sweep --render k8s` writes")
    return int(text)


def run_point(points: list[tuple[str, Scenario]], index: int, out_dir: Path, sweep: str,
              run: Callable[[str, Scenario], dict], stream: TextIO) -> dict:
    """Run point `index` with `run` (a PointRunner writing under `out_dir`) and print its block to `stream`."""
    if not 0 <= index < len(points):
        raise ConfigError(f"--run-point: completion index {index} is outside the sweep's {len(points)} points")
    key, scenario = points[index]
    row = run(key, scenario)
    files = {}
    if row.get("report"):
        report = Path(row["report"])
        for path in (report, report.with_suffix(".md")):
            if path.is_file():
                files[path.relative_to(out_dir).as_posix()] = path.read_text(encoding="utf-8")
    header = {"sweep": sweep, "index": index, "of": len(points), "key": key, "out": str(out_dir)}
    stream.write(f"{BEGIN}{json.dumps(header)}\n{json.dumps({'row': row, 'files': files}, allow_nan=False)}\n"
                 f"{END}{index}\n")
    stream.flush()
    return row


@dataclass
class _Block:
    header: dict
    row: dict
    files: dict[str, str]
    where: str


@dataclass
class Collected:
    rows: list[dict]
    missing: list[int] = field(default_factory=list)  # indexes no log had
    of: int = 0
    store: ResultsStore | None = None


def parse_log(text: str, where: str) -> list[_Block]:
    """The blocks of one log, in order; a block cut short (a log rotated or truncated) is an error naming it."""
    blocks: list[_Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        at = lines[i].find(BEGIN)
        if at < 0:
            i += 1
            continue
        place = f"{where}:{i + 1}"
        try:
            header = json.loads(lines[i][at + len(BEGIN):])
            payload_line = lines[i + 1]
            payload = json.loads(payload_line[payload_line.index('{"row"'):])
            end = lines[i + 2]
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"{place}: a sweep point's block is cut short or garbled ({exc})") from None
        if END + str(header.get("index")) not in end:
            raise ConfigError(f"{place}: a sweep point's block has no end marker for index {header.get('index')}")
        blocks.append(_Block(header, payload["row"], payload.get("files") or {}, place))
        i += 3
    return blocks


def collect(logs_dir: Path, out: Path) -> Collected:
    """Gather every block under `logs_dir` into OUT's results file (see the module docstring)."""
    logs_dir, out = Path(logs_dir), Path(out)
    if not logs_dir.is_dir():
        raise ConfigError(f"--collect {logs_dir}: not a directory of pod logs")
    by_index: dict[int, _Block] = {}
    sweeps: dict[str, str] = {}
    for path in sorted(p for p in logs_dir.rglob("*") if p.is_file()):
        for block in parse_log(path.read_text(encoding="utf-8", errors="replace"), str(path)):
            sweeps.setdefault(block.header["sweep"], block.where)
            index = block.header["index"]
            seen = by_index.get(index)
            if seen is not None and (seen.row, seen.files) != (block.row, block.files):
                raise ConfigError(f"{block.where}: point {index} ({block.header['key']}) differs from the one in "
                                  f"{seen.where}; keep one pod's log per point")
            by_index.setdefault(index, block)
    if not by_index:
        raise ConfigError(f"--collect {logs_dir}: no sweep point in any log (lines starting {BEGIN.strip()})")
    if len(sweeps) > 1:
        raise ConfigError(f"--collect {logs_dir}: logs of {len(sweeps)} different sweeps "
                          f"({', '.join(sweeps.values())}); gather one sweep's logs at a time")
    of = max(block.header["of"] for block in by_index.values())
    store = ResultsStore(out)
    rows = []
    for index in sorted(by_index):
        block = by_index[index]
        pod_out = Path(block.header["out"])
        for relative, text in block.files.items():
            target = out / relative
            if ".." in Path(relative).parts or Path(relative).is_absolute():
                raise ConfigError(f"{block.where}: a report path {relative!r} outside the results directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        row = dict(block.row)
        if row.get("report"):
            row["report"] = str(out / Path(row["report"]).relative_to(pod_out))
        store.add(row)
        rows.append(store.rows[row["key"]])
    return Collected(rows, sorted(set(range(of)) - set(by_index)), of, store)
