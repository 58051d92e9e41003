"""No code of the package, the benchmarks or the load tests (their samplers poll in loops) awaits
`asyncio.wait_for`: on Python 3.11, which the package supports, it loses a cancel that lands in the loop iteration
where the awaited thing completes (CPython gh-86296; 3.12 rebuilt it on `asyncio.timeout`). A loop that retries,
such as the launcher's progress poll, then never ends: that was the launcher's intermittent hang after a run (its
progress task survived `cancel()`, so the agents were never stopped). `async with asyncio.timeout(s):` raises the
same TimeoutError and keeps every cancel.

Read from the source with `ast`, like test_import_direction.py, so an import of the name is found too."""

from __future__ import annotations

import ast
import asyncio
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = [ROOT / "src" / "kvtransit", ROOT / "benchmarks", ROOT / "tests" / "load"]


def _wait_for_calls(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and node.attr == "wait_for" and isinstance(node.value, ast.Name) \
                and node.value.id == "asyncio":
            name = "asyncio.wait_for"
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio" and \
                any(alias.name == "wait_for" for alias in node.names):
            name = "from asyncio import wait_for"
        if name is not None:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {name} (use `async with asyncio.timeout(...)`)")
    return found


def _files():
    for top in CHECKED:
        yield from sorted(top.rglob("*.py"))


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_awaits_asyncio_wait_for(path):
    problems = _wait_for_calls(path)
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_planted_wait_for(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import asyncio\nfrom asyncio import wait_for\nasync def f(c):\n"
                       "    await asyncio.wait_for(c, 1)\n")
    assert _wait_for_calls(planted, root=tmp_path) == [
        "planted.py:2: from asyncio import wait_for (use `async with asyncio.timeout(...)`)",
        "planted.py:4: asyncio.wait_for (use `async with asyncio.timeout(...)`)"]


def test_a_polling_loop_under_asyncio_timeout_always_ends_when_cancelled():
    """The launcher's progress poll in miniature: dial a closed port under a timeout, again and again, and cancel
    it at many moments. Every cancel ends the loop (with `asyncio.wait_for` on 3.11, 85 of these 300 did not: the
    poll ran on to its last dial)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: every dial is refused at once

    async def poll() -> str:
        for _ in range(200):  # bounded, so a lost cancel shows as a poll that finished, not as a hung test
            await asyncio.sleep(0)
            try:
                async with asyncio.timeout(2.0):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
            except OSError:
                continue
        return "ran to its end"

    async def main() -> int:
        lost = 0
        for i in range(300):
            task = asyncio.create_task(poll())
            for _ in range(i % 7):  # cancel at different points of the dial
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
                lost += 1
            except asyncio.CancelledError:
                pass
        return lost

    assert asyncio.run(main()) == 0
