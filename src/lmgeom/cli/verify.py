"""`lmgeom verify STORE`: every file of a store against its recorded checksums (the work is `lmgeom.store.verify_store`)."""

from __future__ import annotations

import typer
from rich.markup import escape

from lmgeom.cli.common import cli_text, console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify_command(
        store: str = typer.Argument(..., metavar="STORE", help="a store written by `lmgeom extract`: a folder or an fsspec URL"),
    ) -> None:
        """Recompute the CRC32C of every chunk file, table and metadata file (meta.json, each layer's zarr.json)
        of a store and compare them with those recorded when it was finished; check meta.json against the
        layer arrays; name each damaged or missing file. Exit 0 when all match, 2 otherwise."""
        from lmgeom.store import verify_store

        with user_errors():
            result = verify_store(store)
        for problem in result.problems:
            console.print(f"[bold red]problem:[/] {escape(problem)}")
        if not result.ok:
            console.print(f"{len(result.problems)} damaged or missing file(s) in {escape(result.store)}; {escape(cli_text(result.advice, ('overwrite',)))}")
            raise typer.Exit(code=2)
        if not result.checksums:
            console.print(f"checksums absent: {escape(result.store)} was written without them, so only its files' presence "
                          "and sizes were checked (all present at their size); re-extract it with --overwrite to record them")
            return
        console.print(f"all {result.checked:,} files of {escape(result.store)} match their recorded CRC32C")
        if not result.metadata:
            console.print("meta.json and the layers' zarr.json have no recorded CRC32C (the store was written before "
                          "they were recorded), so they were checked against the rest of the store only; re-extract it "
                          "with --overwrite to record them")
