"""The ServerApp: flnotes' FedMut (or any method in flnotes.flower.SUPPORTED) as a Flower
strategy. Its settings are [tool.flwr.app.config] in pyproject.toml (RunConfig fields)."""

from flnotes.flower import server_app

app = server_app()
