"""UTF-8 text from bytes read off disk, with the line of the first bad byte.

One rule for every text file the harness reads (hypothesis files, prompt files,
evidence and sweep JSON): the text is UTF-8, and when it is not, the error says
`FILE:LINE: not UTF-8 text (byte 0xNN); save the file as UTF-8`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def utf8(raw: bytes, path: Path | str, error: Callable[[str], Exception], field: str = "") -> str:
    """`raw` (the bytes of `path`) decoded as UTF-8; otherwise raise `error(message)`,
    the message naming the file, the 1-based line of the first bad byte and the byte
    (`field` is put before "not UTF-8", e.g. "(file): ")."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}:{line}: {field}not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                    "save the file as UTF-8") from None
