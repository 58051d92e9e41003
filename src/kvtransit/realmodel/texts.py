"""The texts the real-model checks read, all shipped offline and free to use, and their fixed windows.

- ``gpl-3``: the GNU GPL version 3, /usr/share/common-licenses/GPL-3 (Debian's base-files; "Everyone is
  permitted to copy and distribute verbatim copies of this license document"). English legal prose.
- ``json-decoder``: the Python standard library's json/decoder.py, from the running interpreter's stdlib
  (PSF licence). Python source. Its bytes follow the Python release, so results record its SHA-256 and the
  Python version beside the offsets.

A window is fixed in tokens of the model's tokenizer (plain text, no BOS, no chat template): it starts at
token `offset` of the text, the first `context` tokens are prefilled exactly, and the next `continuation`
tokens are teacher-forced over the (codec'd) cache; each of them predicts the token after it, so a window
reads context + continuation + 1 tokens of the text and scores `continuation` predictions.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kvtransit.realmodel.errors import RealModelError

GPL3_PATH = Path("/usr/share/common-licenses/GPL-3")


def text_paths() -> dict[str, Path]:
    """Text name → the file it is read from."""
    return {"gpl-3": GPL3_PATH, "json-decoder": Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"}


TEXT_NAMES: tuple[str, ...] = ("gpl-3", "json-decoder")

# The default windows: 1,024 tokens of context (a prompt of the size docs/reference.md §4 draws, halved to keep the run
# under 10 minutes on 2 cores), 256 teacher-forced tokens each, two non-overlapping windows per text. GPL-3 is
# 7,658 tokens long, json/decoder.py (Python 3.11) 3,285, so both offsets of each fit with room to spare.
DEFAULT_CONTEXT = 1024
DEFAULT_CONTINUATION = 256
DEFAULT_OFFSETS: dict[str, tuple[int, ...]] = {"gpl-3": (0, 3072), "json-decoder": (0, 1536)}


@dataclass(frozen=True)
class Window:
    text: str
    offset: int  # first token of the window, in the text's tokens
    context: int  # tokens prefilled exactly, whose KV goes through the codec
    continuation: int  # tokens teacher-forced over that cache, each scored on the token after it

    @property
    def span(self) -> int:
        """Tokens of the text the window reads."""
        return self.context + self.continuation + 1

    @property
    def name(self) -> str:
        return f"{self.text}@{self.offset}"


def read_text(name: str) -> str:
    paths = text_paths()
    if name not in paths:
        raise RealModelError(f"unknown text {name!r} (choose from: {', '.join(TEXT_NAMES)})")
    path = paths[name]
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RealModelError(f"text {name}: cannot read {path} ({exc.strerror or exc})") from None


def describe_text(name: str, text: str, tokens: int) -> dict[str, object]:
    """Where a text came from and what it was, for the results file."""
    out: dict[str, object] = {"name": name, "path": str(text_paths()[name]), "tokens": tokens,
                              "sha256": hashlib.sha256(text.encode()).hexdigest()}
    if name == "json-decoder":
        out["python"] = platform.python_version()
    return out


def default_windows(context: int = DEFAULT_CONTEXT, continuation: int = DEFAULT_CONTINUATION) -> list[Window]:
    return [Window(text, offset, context, continuation)
            for text, offsets in DEFAULT_OFFSETS.items() for offset in offsets]


def parse_windows(spec: str, context: int, continuation: int) -> list[Window]:
    """"gpl-3:0,json-decoder:1536" → windows at those token offsets, each `context` + `continuation` long."""
    windows = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        text, sep, offset = item.partition(":")
        if not sep or text not in TEXT_NAMES or not offset.isdigit():
            raise RealModelError(f"--windows: {item!r} is not TEXT:OFFSET with TEXT one of {', '.join(TEXT_NAMES)} "
                                 f"and OFFSET a token index")
        windows.append(Window(text, int(offset), context, continuation))
    if not windows:
        raise RealModelError(f"--windows: no window in {spec!r}")
    return windows


def window_tokens(window: Window, text_ids: list[int]) -> list[int]:
    """The window's span of the text's tokens; a window past the text's end is refused, with the lengths."""
    if window.context < 1 or window.continuation < 1:
        raise RealModelError(f"window {window.name}: context and continuation must be >= 1 token, got "
                             f"{window.context} and {window.continuation}")
    end = window.offset + window.span
    if end > len(text_ids):
        raise RealModelError(f"window {window.name}: needs tokens {window.offset}..{end - 1} (context {window.context} "
                             f"+ continuation {window.continuation} + 1) but {window.text} has {len(text_ids)} tokens")
    return text_ids[window.offset:end]
