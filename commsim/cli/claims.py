"""`commsim claims`: the seed documents' figures against commsim's model."""

from __future__ import annotations

from typing import Annotated

import typer

from commsim.report import terminal


def claims_cmd(
    files: Annotated[
        list[str] | None,
        typer.Argument(help="Scenario files with a claim (default: scenarios/seeds/*.yaml)."),
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Check the figures the seed documents state against commsim's model of their setup."""
    from commsim import claims
    from commsim.report import tables

    with terminal.user_errors():
        paths = files or [str(p) for p in claims.seed_files()]
        if not paths:
            raise ValueError(f"no scenario files given and none in {claims.SEED_DIR}")
        results = []
        with terminal.progress(len(paths), "checking claims") as bar:
            for path in paths:
                results.append(claims.check_claims(path))
                bar.advance(0)
    if json_out:
        terminal.print_json({"claims": [r.to_dict() for r in results]})
        return
    terminal.console.print(tables.claims_table(results))
    held = sum(r.holds for r in results)
    terminal.console.print(
        f"{held} of {len(results)} claims hold (a claim holds when all its checks do; "
        "(Nx): commsim's figure over the stated one). Each file's `reading` says what it "
        "assumes and why a figure does or does not follow."
    )
