"""Entry point: each stage registers its commands from its own module."""

from __future__ import annotations

from typing import Optional

import typer

app = typer.Typer(
    name="lmgeom",
    help="Measure how contextual a language model's representations are and how their space is shaped.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        from lmgeom._version import __version__

        typer.echo(f"lmgeom {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Optional[bool] = typer.Option(None, "--version", callback=_print_version, is_eager=True,
                                                help="print lmgeom's version and exit")) -> None:
    """Measure how contextual a language model's representations are and how their space is shaped."""

from lmgeom.cli import extract  # noqa: E402
from lmgeom.cli import analyze  # noqa: E402
from lmgeom.cli import sts  # noqa: E402
from lmgeom.cli import calibrate  # noqa: E402
from lmgeom.cli import elmo  # noqa: E402
from lmgeom.cli import report  # noqa: E402
from lmgeom.cli import export  # noqa: E402
from lmgeom.cli import experiment  # noqa: E402
from lmgeom.cli import verify  # noqa: E402
from lmgeom.cli import similarity  # noqa: E402
from lmgeom.cli import geometry  # noqa: E402
from lmgeom.cli import attribute  # noqa: E402
from lmgeom.cli import lens  # noqa: E402
from lmgeom.cli import ablate  # noqa: E402

extract.register(app)
analyze.register(app)
sts.register(app)
calibrate.register(app)
elmo.register(app)
report.register(app)
export.register(app)
experiment.register(app)
verify.register(app)
similarity.register(app)
geometry.register(app)
attribute.register(app)
lens.register(app)
ablate.register(app)
