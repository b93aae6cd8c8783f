"""One module per command; each defines `register(app: typer.Typer) -> None` and is found automatically."""
