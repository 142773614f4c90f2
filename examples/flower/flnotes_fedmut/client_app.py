"""The ClientApp: one flnotes client per SuperNode (its partition-id), trained with the
engine's local training, from the same [tool.flwr.app.config] as the server."""

from flnotes.flower import client_app

app = client_app()
