"""Entry point: each stage registers its commands from its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="lmgeom",
    help="Measure how contextual a language model's representations are and how their space is shaped.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

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
