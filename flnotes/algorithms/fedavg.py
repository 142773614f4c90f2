"""FedAvg (McMahan et al. 2017): every client starts from the global model; mean by samples."""

from __future__ import annotations

from flnotes.algorithms.base import Strategy


class FedAvg(Strategy):
    """Federated averaging; ``weighting="uniform"`` gives the unweighted mean."""

    name = "fedavg"
    label = "FedAvg"
    default_weighting = "samples"
