"""The ``rollbox`` command line (Typer); one module per command group."""
