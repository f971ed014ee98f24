"""Files in and out: read with one line naming the file when it cannot be, written whole or
not at all."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read_bytes(path: str | Path) -> bytes:
    """A file's bytes; a SpecError naming it when it is missing, a directory or unreadable."""
    from commsim.specs import SpecError  # here: `commsim --help` imports this module, not pydantic

    if str(path) == "":
        raise SpecError("(empty path)", "", "give a file name")
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise SpecError(str(path), "", "file not found") from None
    except IsADirectoryError:
        raise SpecError(str(path), "", "is a directory, not a file") from None
    except OSError as e:
        raise SpecError(str(path), "", f"cannot read: {e.strerror or e}") from None


def read_text(path: str | Path) -> str:
    """A text file (UTF-8); a SpecError naming it as read_bytes does, or where it is not
    text."""
    from commsim.specs import SpecError

    data = read_bytes(path)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise SpecError(str(path), "", f"not a text file (byte {e.start} is not UTF-8)") from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file holding one object (`what` it should be, for the error); a SpecError
    naming the file, and the line for invalid JSON, otherwise."""
    from commsim.specs import SpecError

    try:
        data = json.loads(read_text(path), object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise SpecError(str(path), f"line {e.lineno}", f"invalid JSON: {e.msg}") from None
    except _DuplicateKey as e:
        raise SpecError(str(path), str(e), "given twice in one object") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "", f"expected a JSON object of {what}")
    return data


class _DuplicateKey(ValueError):
    """A JSON object naming one key twice (json keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice: two `zero_optimization`
    blocks in a ds_config.json ran the second and hid the first."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file whole or not at all: a temporary file beside it, then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        os.chmod(tmp, _mode(path))  # mkstemp's 0600 would hide the file from others
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode(path: Path) -> int:
    """The mode the file has, or a new file's under the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# what --plot writes (matplotlib's formats); a path without a suffix gets a PNG
IMAGE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def image_format(path: str | Path) -> str:
    """The image format a path's suffix names (png without one)."""
    return Path(path).suffix.lstrip(".").lower() or "png"


def check_output(path: str | None, flag: str, image: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written whole: empty, a
    directory, in a directory that does not exist or cannot be written, or (an image) of a
    format no plot can take. A ValueError names the flag and the path."""
    if path is None:
        return
    where = f"{flag} {path!r}"
    if not path.strip():
        raise ValueError(f"{flag}: empty path: give a file name")
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{where}: is a directory: give a file name in it")
    if not parent.is_dir():
        raise ValueError(f"{where}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{where}: cannot write there (permission denied)")
    if image and image_format(p) not in IMAGE_FORMATS:
        raise ValueError(
            f"{where}: not an image format; end the name in one of {', '.join(IMAGE_FORMATS)}"
        )


def check_outputs(outputs: dict[str, str | None], inputs: tuple[str | None, ...] = ()) -> None:
    """check_output for each output flag (--plot an image); no file named by two flags (the
    later write would replace the earlier: --plot x.png --html x.png kept the page) or one
    the run reads (`inputs`: --csv run.yaml replaced the scenario)."""
    read = {Path(p).resolve() for p in inputs if p and Path(p).is_file()}
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        check_output(path, flag, image=flag == "--plot")
        if path is None:
            continue
        if Path(path).resolve() in read:
            raise ValueError(f"{flag} {path!r}: this run reads that file; give another name")
        same = seen.setdefault(Path(path).resolve(), flag)
        if same != flag:
            raise ValueError(f"{flag} {path!r}: {same} writes that file too; give each its own")


def save_figure(fig, path: str | Path) -> None:
    """A matplotlib figure written whole or not at all, in the format its suffix names."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=image_format(path), dpi=120)
    write_atomic(path, buf.getvalue())
