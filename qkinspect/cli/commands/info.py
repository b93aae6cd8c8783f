"""`qkinspect info`: what a checkpoint holds (shapes, flags, bytes of attention weights)."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        model: str = typer.Argument(None, help="Folder, file, hub id or .gguf; omit for the demo model."),
        fmt: str = typer.Option("table", "--format", help="table or json"),
    ) -> None:
        """Summarise a model's attention blocks.

        Example: qkinspect info ./my-bert --format json
        """
        from dataclasses import asdict

        from qkinspect.loading import open_model

        with open_model(model) as m:
            d = asdict(m.info)
        print(json.dumps(d, indent=2))
