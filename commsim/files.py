"""Files in and out: read with one line naming the file when it cannot be, written whole or
not at all."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from commsim.specs import SpecError


def read_bytes(path: str | Path) -> bytes:
    """A file's bytes; a SpecError naming it when it is missing or unreadable."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise SpecError(str(path), "", "file not found") from None
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror or e}") from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file holding one object (`what` it should be, for the error); a SpecError
    naming the file, and the line for invalid JSON, otherwise."""
    try:
        data = json.loads(read_bytes(path).decode())
    except UnicodeDecodeError:
        raise SpecError(str(path), "", "not a text file") from None
    except json.JSONDecodeError as e:
        raise SpecError(str(path), f"line {e.lineno}", f"invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "", f"expected a JSON object of {what}")
    return data


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file whole or not at all: a temporary file beside it, then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
