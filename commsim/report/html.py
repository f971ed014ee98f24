"""One self-contained HTML page a user can hand on: the tables as HTML tables, the plots
inline as base64 PNG, and the inputs and assumptions that produced them. No scripts, no
files beside it, nothing fetched."""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from commsim import __version__
from commsim.files import write_atomic

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #ddd; }
footer { margin-top: 2em; color: #777; font-size: 0.8em; }
"""


def _plain(cell: Any) -> str:
    """A rich cell (markup string or Text) as plain text."""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain


def _table(table: Table) -> str:
    """A rich Table as an HTML table: its title as the caption, headers (when shown), rows."""
    columns = table.columns
    rows = list(zip(*(list(c.cells) for c in columns), strict=True)) if columns else []
    out = ["<table>"]
    if table.title:
        out.append(f"<caption>{html.escape(_plain(table.title))}</caption>")
    if table.show_header:
        heads = "".join(f"<th>{html.escape(_plain(c.header))}</th>" for c in columns)
        out.append(f"<thead><tr>{heads}</tr></thead>")
    out.append("<tbody>")
    for row in rows:
        cells = "".join(
            f"<td{' class=num' if c.justify == 'right' else ''}>{html.escape(_plain(v))}</td>"
            for c, v in zip(columns, row, strict=True)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def figure_png(draw: Callable[[str], None]) -> bytes:
    """The PNG a plotting function (given a path) draws, read back from a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "figure.png"
        draw(str(path))
        return path.read_bytes()


class Report:
    """Sections of one page, in order; `write` puts it in a file whole or not at all."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def table(self, table: Table) -> None:
        self.parts.append(_table(table))

    def figure(self, png: bytes, caption: str) -> None:
        data = base64.b64encode(png).decode("ascii")
        self.parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )

    def lines(self, items: Iterable[str]) -> None:
        body = "".join(f"<li>{html.escape(i)}</li>" for i in items)
        if body:
            self.parts.append(f"<ul>{body}</ul>")

    def code(self, text: str) -> None:
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def html(self) -> str:
        title = html.escape(self.title)
        return "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en"><head><meta charset="utf-8">',
                f"<title>{title}</title><style>{STYLE}</style></head><body>",
                f"<h1>{title}</h1>",
                *self.parts,
                f"<footer>commsim {__version__}</footer>",
                "</body></html>",
                "",
            ]
        )

    def write(self, path: str) -> None:
        write_atomic(path, self.html())
