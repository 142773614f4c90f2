"""flnotes' methods on Flower (``pip install 'flnotes[flower]'``, Flower 1.x Message API).

No framework offers FedMut, FedQP, FedMR or FedUp; Flower is where federated learning runs outside a
simulation. This subpackage runs flnotes' own strategies there, not a second implementation of them:

- :mod:`.server`: :class:`FlowerStrategy`, a ``flwr.serverapp.strategy.Strategy`` around the
  engine's :class:`~flnotes.engine.sim.Simulation` (the same sampling, ``dispatch``,
  ``aggregate``, evaluation and run folder as ``flnotes.run``), and :func:`server_app`;
- :mod:`.client`: :func:`client_app`, a ``ClientApp`` that trains one flnotes client with the
  engine's local training (:func:`flnotes.engine.backends.train_clients`);
- :mod:`.records`: states <-> ``ArrayRecord``, Flower's run config -> ``RunConfig``;
- :mod:`.inprocess`: an in-process ``Grid`` that hands each message to the ClientApp in
  the same process (tests and teaching; no Ray, no network);
- :mod:`.dropin`: :class:`FedMut`, :class:`FedQP`, :class:`FedMR`, :class:`FedExP`, :class:`CluSamp`
  and :class:`FedCross`, Flower ``FedAvg`` strategies for any ClientApp and model (the user's own
  data and training), whose rounds are flnotes' strategies over the ArrayRecords.

How a round travels: the server samples clients as the engine does, from the stream
(seed, "sample", round) or the strategy's ``select_clients``; each flnotes client index is a
Flower node, found by its ``partition-id`` node config. Each sampled client gets one train
message whose ``arrays`` record is its own start state, so FedMut's mutants and FedMR's
recombined models are simply different messages; its ``config`` record carries the round,
the client index and the settings hash (a node built from other settings refuses the
message). The reply carries the trained state and ``num-examples``, ``train_loss`` and the
method's extras as metrics.

Where a method needs more than that:

- FedUp's penalty needs X^(t-1), the server's previous global model: the server sends the
  entries of ``penalty_anchor`` that are not the start state (``previous:<name>``) as a
  second ArrayRecord, ``anchor``. FedProx's anchor is the start state itself: nothing extra.
- FML's personal model never leaves its client: it lives in the node's ``context.state``
  (an ArrayRecord ``fml-personal-<client>``), which Flower keeps on the node for the whole run and
  never sends. The engine keeps the same model in the server process's strategy, so both
  train the same personal model; its accuracy is measured on the client's held-out rows
  and returned as a number (``personal_accuracy``: the round's clients, sample-weighted).
- Methods whose clients keep state the server reads back (SCAFFOLD's and FedDyn's control
  variates, MOON's previous model, MimeLite's and STEM's momenta, FedSMOO's duals, FedPVR)
  or whose local loss needs a server model each step (FedGen's generator) are not offered:
  in flnotes that state lives in the strategy, and splitting it is work not yet done.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError:  # one line, the fix in it (not a traceback from deep inside flwr)
    raise ImportError("flnotes.flower needs Flower: pip install 'flnotes[flower]'") from None

from flnotes.flower.client import client_app
from flnotes.flower.dropin import CluSamp, FedCross, FedExP, FedMR, FedMut, FedQP
from flnotes.flower.records import SUPPORTED, check_supported, config_from_run_config
from flnotes.flower.server import FlowerStrategy, server_app

__all__ = ["SUPPORTED", "CluSamp", "FedCross", "FedExP", "FedMR", "FedMut", "FedQP",
           "FlowerStrategy", "check_supported", "client_app", "config_from_run_config",
           "server_app"]
