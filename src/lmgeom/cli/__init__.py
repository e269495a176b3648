"""The `lmgeom` command line: a thin typer shell over the Python API."""
