"""Drop-in Flower strategies: FedMut, FedQP, FedMR, FedExP, CluSamp and FedCross for any ClientApp.

:class:`~flnotes.flower.FlowerStrategy` runs a whole flnotes config (its data, model,
ClientApp and server-side test set). These classes need none of that: each is Flower's own
``flwr.serverapp.strategy.FedAvg`` whose round is the flnotes method's, over whatever
``ArrayRecord`` the user's ClientApp trains and returns (any model, any data)::

    from flnotes.flower.dropin import FedMut
    strategy = FedMut(alpha=4.0, seed=0, fraction_train=0.5)
    result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=50)

The server side is flnotes' own strategy object (:mod:`flnotes.algorithms`: FedMut's
``sign_mutations``, FedQP's ``project_mutants``, FedMR's ``recombine``, FedExP's
``server_step_size``, CluSamp's clustering, FedCross's ``cross_aggregate``), built at round 1 around
the ``initial_arrays`` given to ``start``; nothing of a method is written twice. Per round:

- ``configure_train``: the method picks the clients (CluSamp's ``select_clients``, or the engine's
  seeded uniform sampling: ``sample_clients`` with (seed, "sample", round)) and the model each
  starts from (``dispatch``: a mutant, a recombined model, FedExP's extrapolated iterate, a FedCross
  middleware model); each sampled node gets its own train message, ``arrays`` its start model and
  ``config`` the ``train_config`` of ``start`` plus ``server-round``, as FedAvg's;
- ``aggregate_train``: the replies (one ArrayRecord and one MetricRecord each, as FedAvg
  checks) become the method's ``aggregate``; the returned ArrayRecord is the method's global
  model (FedExP: the mean of its last two iterates); the MetricRecord is FedAvg's weighted
  mean of the clients' metrics plus the method's round metrics (FedExP ``server_step``,
  FedMR and FedCross ``model_similarity``, CluSamp ``clusters``).

Evaluation (``configure_evaluate``, ``aggregate_evaluate``, ``evaluate_fn``) is FedAvg's.

Where Flower and the engine differ, and what is decided here:

- Clients are Flower nodes, numbered as they are first seen: at round 1 (after waiting for
  ``min_available_nodes``) client k is the k-th smallest connected node id; a node first seen at a
  later round becomes the next client (N, N+1, ...; several at once in node-id order) and keeps that
  number. Each round samples from the clients whose nodes are connected then
  (``grid.get_node_ids()``): the engine's seeded sampling picks positions in that list
  (``sample_clients`` with (seed, "sample", round) over its length), so with a fixed set of nodes a
  run samples exactly as ``flnotes.run`` does, and with the same nodes joining at the same rounds it
  samples the same clients again. The round's sample size is FedAvg's,
  ``max(int(N * fraction_train), min_train_nodes)`` with N the nodes at round 1, kept as the
  method's K (FedMR recombines K models each round, FedCross keeps K middleware models), and no more
  than the clients connected. Exception, CluSamp: its clustering holds a row per client of a fixed
  population, so its federation stays the nodes of round 1; a node that joins later is not drawn,
  and a node that left can still be drawn (its failed reply is left out).
- A ``seed`` fixes the sampling and every random draw of the method (mutation signs, FedQP's
  projections, FedMR's permutations, CluSamp's draws): two runs with the same seed, nodes
  and replies send the same models. With the same seed, clients and local training, a
  drop-in gives ``flnotes.run``'s global model (``tests/test_flower_dropin.py``).
- Weights: ``weighting`` is the method's default (``uniform`` for FedMut, FedQP, FedMR and
  FedCross, as their official code; ``samples`` for FedExP and CluSamp), ``samples`` reading each
  reply's ``weighted_by_key`` metric (``num-examples``).
- Failed replies are logged and left out, as FedAvg does; the method aggregates the rest.
  FedMR recombines the models it got (FedCross fuses them), so after a failure its next
  round samples as many clients as it holds models.
- CluSamp's importance needs every client's sample count, which Flower's server learns only
  from replies: a client not heard from yet counts as the mean of those heard from (1
  before any reply). With ``weighting="uniform"`` no counts are needed.
- Resuming: FedMut's last update, FedMR's local models and the like live in the strategy,
  so a restarted ServerApp would start over at round 1. With ``state_file=PATH`` the
  drop-in writes its state (round, global model, flnotes strategy's ``state_dict``,
  federation, sample counts) to PATH after every round, atomically, and ``start`` goes on
  from it after a restart (:meth:`DropInStrategy.start`).
- Not offered: FedMR's ``secure_exchanges`` (a simulation of a client-to-client layer swap,
  which a Flower deployment would do between ClientApps) and the methods whose clients keep
  state or need extra local-training terms (:data:`flnotes.flower.SUPPORTED` through
  :class:`~flnotes.flower.FlowerStrategy` covers FedUp, FedProx, FML, ...).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from flnotes.algorithms import build_strategy, settings_of
from flnotes.algorithms.base import ClientResult
from flnotes.config import RunConfig
from flnotes.engine.client_state import write_atomically
from flnotes.engine.sim import sample_clients
from flnotes.flower.records import check_timeout, record_state, state_record
from flnotes.messages import did_you_mean
from flnotes.rng import torch_generator

log = logging.getLogger("flwr")


# Flower FedAvg's constructor arguments, which every drop-in takes and passes on unchanged.
# They are named in DropInStrategy's signature (not taken as **kwargs) so that help() and
# inspect.signature show them; their defaults are read from the installed FedAvg, so a drop-in
# left at its defaults behaves as FedAvg does.
_DEFAULTS = {name: parameter.default for name, parameter
             in inspect.signature(FedAvg.__init__).parameters.items() if name != "self"}
FEDAVG_ARGUMENTS = tuple(_DEFAULTS)
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def _names_checked(init: Callable) -> Callable:
    """``init``, raising a one-line TypeError with a did-you-mean for an unknown keyword
    (Python's own message names it but suggests nothing). ``functools.wraps`` keeps the
    signature that help() and inspect.signature show."""
    parameters = inspect.signature(init).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return init  # a subclass that takes any keyword checks its own
    names = [name for name in parameters if name != "self"]

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in parameters or name == "self":
                raise TypeError(f"{type(self).__name__}() got an unexpected argument {name!r}"
                                f"{did_you_mean(name, names)}")
        init(self, *args, **kwargs)

    return checked


def _settings_constructor(cls: type[DropInStrategy]) -> Callable:
    """A drop-in's ``__init__``: its method's flnotes settings as keywords (under the
    ``renamed`` argument names, with flnotes' defaults), then DropInStrategy's own and Flower
    FedAvg's; the signature is set on it, so help(), Jupyter's tooltips and inspect.signature
    show every argument with its default."""
    argument = {setting: name for name, setting in cls.renamed.items()}
    declared = {argument.get(name, name): setting for name, setting in
                settings_of(cls.method).items() if name not in cls.not_offered}
    own = list(inspect.signature(DropInStrategy.__init__).parameters.values())
    signature = inspect.Signature(
        [own[0]]  # self; the rest after `settings`
        + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=setting.default,
                             annotation=(setting.kind or type(setting.default)).__name__)
           for name, setting in declared.items()] + own[2:], return_annotation="None")

    def __init__(self, **kwargs: Any) -> None:
        bound = signature.bind(self, **kwargs)
        bound.apply_defaults()
        given = {name: value for name, value in bound.arguments.items() if name != "self"}
        settings = {declared[name].name: given.pop(name) for name in declared}
        super(cls, self).__init__(settings, **given)  # the next class in a user's MRO too

    __init__.__signature__ = signature
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class DropInStrategy(FedAvg):
    """FedAvg whose round is a flnotes method's (see the module doc); subclasses name it.

    ``settings``: the method's flnotes settings by their RunConfig names; ``seed``: the
    seed of every draw; ``weighting``: ``"uniform"``, ``"samples"`` or None (the method's
    default); ``state_file``: a file to keep the run's state in, written after every round
    and read by ``start`` (see :meth:`start`). The other keywords are Flower FedAvg's
    (:data:`FEDAVG_ARGUMENTS`, with FedAvg's defaults), passed on unchanged.
    """

    method = ""  # the flnotes registry name
    # True when the method's state has one entry per client of a fixed population
    # (CluSamp): later nodes are then not numbered or sampled (see the module doc).
    fixed_federation = False
    renamed: dict[str, str] = {}  # constructor argument -> flnotes setting (FedExP's eps)
    not_offered: tuple[str, ...] = ()  # the method's settings not offered (see the module doc)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:  # a user's subclass with its own constructor
            cls.__init__ = _names_checked(cls.__dict__["__init__"])
        elif cls.__dict__.get("method") and cls.__module__ == __name__:
            # a shipped drop-in: its constructor from its declarations (a user's subclass that
            # names a method keeps DropInStrategy's, which takes a dict of settings)
            cls.__init__ = _names_checked(_settings_constructor(cls))

    @_names_checked
    def __init__(self, settings: dict[str, Any], *, seed: int = 0,
                 weighting: str | None = None, state_file: str | os.PathLike | None = None,
                 fraction_train: float = _DEFAULTS["fraction_train"],
                 fraction_evaluate: float = _DEFAULTS["fraction_evaluate"],
                 min_train_nodes: int = _DEFAULTS["min_train_nodes"],
                 min_evaluate_nodes: int = _DEFAULTS["min_evaluate_nodes"],
                 min_available_nodes: int = _DEFAULTS["min_available_nodes"],
                 weighted_by_key: str = _DEFAULTS["weighted_by_key"],
                 arrayrecord_key: str = _DEFAULTS["arrayrecord_key"],
                 configrecord_key: str = _DEFAULTS["configrecord_key"],
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=min_available_nodes, weighted_by_key=weighted_by_key,
                         arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.settings = dict(settings)
        self.seed = seed
        self.weighting = weighting
        self._run_config(num_clients=2, clients_per_round=1)  # one-line errors, now
        self.strategy = None  # flnotes' strategy, built at round 1 around initial_arrays
        self.nodes: list[int] = []  # the federation: client k is nodes[k]
        self.clients_per_round = 0
        self.sizes: dict[int, float] = {}  # client -> its last weighted_by_key value
        self._sent: tuple[int, dict[int, int]] | None = None  # (round, node -> client)
        self.state_file = Path(state_file) if state_file is not None else None
        self.resumed_round = 0  # the round the state file was written after; 0: from round 1
        self._arrays: ArrayRecord | None = None  # the global model last handed to Flower

    # ---- resuming -------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Flower's ``Strategy.start``; with a ``state_file`` that exists, from where it was
        written.

        The file holds, after round k: k, the global model returned at k, flnotes' strategy
        (its ``state_dict``: FedMut's last update, FedMR's local models, FedExP's iterates,
        CluSamp's representative updates), the federation and the clients' sample counts. A
        restarted ServerApp given the same file (and the same method, settings and seed)
        goes on at round k + 1 and ends where an uninterrupted run would: ``initial_arrays``
        is then not read. Rounds 1..k are passed over in Flower's loop (no messages, no
        evaluation: that run did them, and the Result holds rounds k+1.. only). The file is
        rewritten whole after each round (a temporary file renamed over it), so a run killed
        at any moment leaves the last finished round's state. Delete it to start over.
        """
        timeout = check_timeout(timeout)
        self.resumed_round = 0
        if self.state_file is not None:
            if not self.state_file.parent.is_dir():
                raise ValueError(f"{type(self).__name__}'s state_file {self.state_file}: no "
                                 f"folder {self.state_file.parent}")
            if self.state_file.exists():
                self._restore(self.state_file)
                log.info("%s: resuming after round %d from %s%s", type(self).__name__,
                         self.resumed_round, self.state_file,
                         "" if self.resumed_round < num_rounds else
                         f"; it is past num_rounds={num_rounds}, so no round is run")
        if self.resumed_round and evaluate_fn is not None:
            # rounds 0..resumed were evaluated by the run that wrote the state file
            resumed, evaluate = self.resumed_round, evaluate_fn
            evaluate_fn = lambda rnd, arrays: None if rnd <= resumed else evaluate(rnd, arrays)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn)

    def _identity(self) -> dict[str, Any]:
        """What a state file must match to be this run's."""
        return {"method": self.method, "settings": self.settings, "seed": self.seed,
                "weighting": self.weighting}

    def _save(self, server_round: int) -> None:
        """With a ``state_file``, the state after ``server_round``, written atomically (see
        :meth:`start`)."""
        if self.state_file is None:
            return
        saved = {**self._identity(), "round": server_round, "arrays": record_state(self._arrays),
                 "strategy": self.strategy.state_dict(), "nodes": list(self.nodes),
                 "clients_per_round": self.clients_per_round, "sizes": dict(self.sizes)}
        write_atomically(self.state_file, lambda f: torch.save(saved, f))

    def _restore(self, path: Path) -> None:
        """This strategy as it was after the round ``path`` was written at."""
        try:
            # weights_only: a state file holds tensors, numbers, strings, lists and dicts;
            # nothing in it is code to run.
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - a bad file is one line, whatever the cause
            raise ValueError(f"{type(self).__name__}'s state_file {path} cannot be read "
                             f"({type(err).__name__}: {str(err).splitlines()[0]}); delete it "
                             "to start over") from None
        differs = [f"{k}={saved.get(k)!r}, not {v!r}" for k, v in self._identity().items()
                   if saved.get(k) != v]
        if differs:
            raise ValueError(f"{type(self).__name__}'s state_file {path} is another run's "
                             f"({'; '.join(differs)}): give another file, or delete it to "
                             "start over")
        self.nodes = [int(n) for n in saved["nodes"]]
        self.clients_per_round = int(saved["clients_per_round"])
        config = self._run_config(len(self.nodes), self.clients_per_round)
        self.strategy = build_strategy(config, saved["strategy"]["global_state"])
        self.strategy.load_state_dict(saved["strategy"])
        self.sizes = {int(c): float(w) for c, w in saved["sizes"].items()}
        self._arrays = state_record(saved["arrays"])
        self._sent = None
        self.resumed_round = int(saved["round"])

    # ---- the flnotes side ---------------------------------------------------------
    def _run_config(self, num_clients: int, clients_per_round: int) -> RunConfig:
        """The RunConfig flnotes' strategy reads: the method's settings, seed, weighting."""
        try:
            return RunConfig(algorithm=self.method, num_clients=num_clients,
                             clients_per_round=clients_per_round, seed=self.seed,
                             weighting=self.weighting, **self.settings).resolved()
        except (ValueError, TypeError) as err:
            raise type(err)(self._message(str(err))) from None

    def _message(self, text: str) -> str:
        """A RunConfig message in this class's words: FedMut(alpha=-1.0) is invalid: ..."""
        name, ours = type(self).__name__, lambda m: self._argument(m.group(1))
        text = re.sub(r"RunConfig\.(\w+)=(\S*) is",
                      lambda m: f"{name}({ours(m)}={m.group(2)}) is", text)
        text = re.sub(r"RunConfig\.(\w+)", lambda m: f"{name}'s {ours(m)}", text)
        return " ".join(text.split())

    def _begin(self, arrays: ArrayRecord, grid: Grid) -> None:
        """Round 1: the federation (the nodes connected now), K, and flnotes' strategy
        around ``arrays``, the model ``start`` was given."""
        need = max(self.min_available_nodes, self.min_train_nodes)
        while len(nodes := sorted(grid.get_node_ids())) < need:
            log.info("Waiting for nodes to connect: %d connected (minimum required: %d).",
                     len(nodes), need)
            time.sleep(1)
        size = min(max(int(len(nodes) * self.fraction_train), self.min_train_nodes), len(nodes))
        self.nodes = nodes
        self.clients_per_round = max(size, 1)
        config = self._run_config(len(nodes), self.clients_per_round)
        try:
            self.strategy = build_strategy(config, record_state(arrays))
        except ValueError as err:
            raise ValueError(self._message(str(err))) from None
        self.sizes = {}

    def _connected(self, grid: Grid) -> list[int]:
        """The clients whose nodes are connected now, in client order; a node not seen
        before becomes the next client (several: in node-id order)."""
        connected = set(grid.get_node_ids())
        if not self.fixed_federation:
            self.nodes += sorted(connected - set(self.nodes))
        return [k for k, node in enumerate(self.nodes) if node in connected]

    def _select(self, server_round: int, available: list[int], size: int) -> list[int]:
        """The round's clients, ``size`` of them (K; fewer: see _OneModelPerClient), as the
        engine picks them (Simulation.begin_round), from ``available`` (positions in it: all
        clients when every node is connected)."""
        size = min(size, len(available))
        known = [self.sizes[c] for c in range(len(self.nodes)) if c in self.sizes]
        fallback = sum(known) / len(known) if known else 1.0
        sizes = [self.sizes.get(c, fallback) for c in range(len(self.nodes))]
        clients = self.strategy.select_clients(
            server_round, sizes, size, torch_generator(self.seed, "sample", server_round))
        if clients is not None:
            return clients
        sampling = SimpleNamespace(seed=self.seed, num_clients=len(available),
                                   clients_per_round=size)
        return [available[p] for p in sample_clients(sampling, server_round)]

    # ---- Flower's hooks -------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        """The method's clients, each with its own start model (one message per node)."""
        if server_round <= self.resumed_round:
            log.info("configure_train: round %d was run before the restart (state_file)",
                     server_round)
            return []
        if self.fraction_train == 0.0:
            return []
        if server_round == 1 or self.strategy is None:
            self._begin(arrays, grid)
            self._arrays = arrays
        available = self._connected(grid)
        clients = self._select(server_round, available, self.clients_per_round) if available else []
        if not clients:
            log.warning("configure_train: no node is connected; round %d trains nobody",
                        server_round)
            self._sent = (server_round, {})
            return []
        starts = self.strategy.dispatch(server_round, clients)
        log.info("configure_train: %s sent %d models to %d of %d connected nodes",
                 type(self).__name__, len({id(s) for s in starts}), len(clients), len(available))
        # one record per distinct start model
        records = {id(s): state_record(s) for s in {id(s): s for s in starts}.values()}
        self._sent = (server_round, {self.nodes[c]: c for c in clients})
        return [Message(content=RecordDict({self.arrayrecord_key: records[id(start)],
                                            self.configrecord_key: ConfigRecord(
                                                {**config, "server-round": server_round})}),
                        message_type=MessageType.TRAIN, dst_node_id=self.nodes[client])
                for client, start in zip(clients, starts, strict=True)]

    def aggregate_train(self, server_round: int, replies) -> tuple[ArrayRecord | None,
                                                                      MetricRecord | None]:
        """The replies, in client order, through the method's ``aggregate``."""
        if server_round <= self.resumed_round:  # the restored model, as that round's
            return self._arrays, None
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if self._sent is None or self._sent[0] != server_round:
            return None, None
        client_of, self._sent = self._sent[1], None
        results = []
        names = list(self.strategy.global_state)
        for reply in valid:
            node = reply.metadata.src_node_id
            if node not in client_of:
                log.warning("aggregate_train: a reply from node %d, which was not sent a "
                            "model this round, is left out", node)
                continue
            client = client_of[node]
            state = record_state(next(iter(reply.content.array_records.values())))
            if list(state) != names:
                raise ValueError(f"round {server_round}: node {node} replied with arrays "
                                 f"{list(state)[:4]}..., not the model's {names[:4]}...; a "
                                 "ClientApp must return the whole model it was sent")
            metrics = next(iter(reply.content.metric_records.values()))
            self.sizes[client] = weight = float(metrics[self.weighted_by_key])
            loss = float(metrics.get("train_loss", math.nan))
            results.append(ClientResult(client, state, weight, loss, {}))
        if not results:
            self._save(server_round)  # the round is over, the model unchanged
            return None, None
        results.sort(key=lambda r: r.client)  # the engine's order: a sum's order decides bits
        state = self.strategy.aggregate(server_round, results)
        contents = [r.content for r in valid if r.metadata.src_node_id in client_of]
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        metrics.update({k: float(v) for k, v in self.strategy.round_metrics(None).items()})
        self._arrays = state_record(state)
        self._save(server_round)
        return self._arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        """FedAvg's, except for the rounds run before a restart (nothing)."""
        return ([] if server_round <= self.resumed_round
                else list(super().configure_evaluate(server_round, arrays, config, grid)))

    def summary(self) -> None:
        """FedAvg's summary, after the method and its settings."""
        shown = ", ".join(f"{self._argument(k)}={v!r}" for k, v in self.settings.items())
        log.info("\t├──> %s (flnotes): %s, seed=%d, weighting=%s", type(self).__name__, shown,
                 self.seed, self.weighting or "the method's default")
        super().summary()

    def _argument(self, setting: str) -> str:
        return {v: k for k, v in self.renamed.items()}.get(setting, setting)


class FedMut(DropInStrategy):
    """FedMut (Hu et al., AAAI 2024): each sampled client trains from its own mutant
    w + alpha v g of the global model (g: the last global update; balanced signs
    v in {1, -1 + beta_t}, beta_t from beta0 to 0 over beta_rounds). Round 1 sends the
    initial model to all; aggregation is the uniform mean (``weighting``)."""

    method = "fedmut"


class FedQP(DropInStrategy):
    """FedQP (Weng et al., SEKE 2024): FedMut's mutants, each layer's mutation projected
    with probability ``qp_prob`` onto the half-space that agrees with g."""

    method = "fedqp"


class _OneModelPerClient(DropInStrategy):
    """A method that keeps one model per client of the last round and sends each client one
    of them (FedMR's local models, FedCross's middleware models): it samples as many clients
    as it holds models, which after a failed reply are fewer than K, and with fewer nodes
    connected than models it cuts the models to one per client (the first ones kept), as a
    failed reply would leave them."""

    kept = ""  # the flnotes strategy's attribute holding the models, one per client

    def _keeps(self, server_round: int) -> bool:
        """Whether this round's clients start from the kept models."""
        return bool(getattr(self.strategy, self.kept))

    def _select(self, server_round: int, available: list[int], size: int) -> list[int]:
        """K clients, or after a failed reply as many as there are models kept; the kept
        models cut to one per client when fewer are connected."""
        if not self._keeps(server_round):
            return super()._select(server_round, available, size)
        kept = getattr(self.strategy, self.kept)
        clients = super()._select(server_round, available, min(len(kept), size))
        if len(clients) < len(kept):
            setattr(self.strategy, self.kept, kept[:len(clients)])
        return clients


class FedMR(_OneModelPerClient):
    """FedMR (Hu et al., KDD 2024): the last round's local models, every layer (or every one of
    ``segments`` groups of layers) shuffled across them, one recombined model per client; the
    reported global model is their mean. ``stage1_rounds`` rounds of plain FedAvg first."""

    method = "fedmr"
    not_offered = ("secure_exchanges",)
    kept = "local_states"

    def _keeps(self, server_round: int) -> bool:
        """Its local models are recombined from stage 2 on."""
        return self.strategy.recombining(server_round)


class FedExP(DropInStrategy):
    """FedExP (Jhunjhunwala et al., ICLR 2023): the server moves eta_g times the mean update,
    eta_g = max(1, sum p_i |D_i|^2 / (2 (|mean D|^2 + eps))); clients train from that
    iterate, the returned global model is the mean of the last two (``average``)."""

    method = "fedexp"
    renamed = {"eps": "fedexp_eps", "eps_per_client": "fedexp_eps_per_client",
               "average": "fedexp_average"}


class CluSamp(DropInStrategy):
    """Clustered sampling (Fraboni et al., ICML 2021, Alg. 2): clients clustered by their
    last updates (``distance``: cosine, l1 or l2; Ward tree), one client drawn from each of
    K distributions; the new global model is the mean of the draws (``aggregation``; and
    ``similarity``: the seed code's readings, see :mod:`flnotes.algorithms.clusamp`)."""

    method = "clusamp"
    fixed_federation = True  # one representative update per client of round 1
    renamed = {"distance": "clusamp_distance", "sketch": "clusamp_sketch",
               "aggregation": "clusamp_aggregation", "similarity": "clusamp_similarity"}


class FedCross(_OneModelPerClient):
    """FedCross (Hu et al., ICDE 2024): K middleware models, one per sampled client; after
    local training each upload is fused with a collaborator chosen among the others
    (``selection``: lowest-similarity by default), w_i = alpha v_i + (1 - alpha) v_co; the
    reported global model is their mean. Round 1 sends the initial model to all."""

    method = "fedcross"
    renamed = {"alpha": "cross_alpha", "selection": "cross_selection"}
    kept = "middleware"


DROP_INS = {cls.method: cls for cls in (FedMut, FedQP, FedMR, FedExP, CluSamp, FedCross)}

__all__ = ["DROP_INS", "FEDAVG_ARGUMENTS", "CluSamp", "DropInStrategy", "FedCross", "FedExP",
           "FedMR", "FedMut", "FedQP"]
