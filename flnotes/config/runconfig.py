"""RunConfig: every setting of a federated run, validated on construction.

The field names are also the papermill parameters and the command-line flags
(``--clients-per-round``). Fields left as ``None`` take the algorithm's or dataset's
default; :meth:`RunConfig.resolved` fills them in, and a run records the resolved config.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from flnotes.messages import did_you_mean

PARTITIONS = ("iid", "dirichlet", "shards", "natural")
BACKENDS = ("auto", "loop", "vmap")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
WEIGHTINGS = ("samples", "uniform")
MUTATIONS = ("sign", "gaussian")

# Model used when `model` is None, by dataset.
DEFAULT_MODEL = {
    "synthetic": "mlp",
    "toy": "toy",
    "cifar10": "cnn",
    "cifar100": "cnn",
    "mnist": "mlp",
    "fashion-mnist": "mlp",
    "shakespeare": "lstm",
    "femnist": "femnist-cnn",
}


@dataclass(frozen=True)
class RunConfig:
    """All settings of one federated run (``python -m flnotes run --help`` says what each does)."""

    # what to run
    algorithm: str = "fedavg"
    dataset: str = "synthetic"  # or "A+B": tasks side by side for FML (Fig. 6; data/multitask)
    model: str | None = None  # None: the dataset's usual model (DEFAULT_MODEL)
    data_dir: str | None = None  # None: $FLNOTES_DATA or ~/.cache/flnotes/data
    download: bool = False
    data_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"coarse": True}
    # how data is split over clients
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    shards_per_client: int = 2
    min_client_size: int = 10
    partition_manifest: str | None = None  # load (or save) the exact split here
    client_test_fraction: float | None = None  # held-out share of each client's data
    # federation and local training
    num_clients: int = 20
    clients_per_round: int = 10
    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 50
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    weighting: str | None = None  # None: the algorithm's default
    # algorithm hyperparameters
    mu: float = 0.01  # FedProx proximal weight
    alpha: float | None = None  # FedMut/FedQP mutation range; FedUp penalty weight
    beta0: float = 0.3  # FedMut initial preference
    beta_rounds: int = 50  # FedMut T_b: rounds over which beta decays to 0
    qp_prob: float = 0.5  # FedQP: probability of projecting a layer
    mutation: str = "sign"  # FedQP mutation: sign (FedMut's) or gaussian
    stage1_rounds: int = 0  # FedMR: rounds of plain FedAvg before recombination
    segments: int = 0  # FedMR-p: 0 means every layer is its own segment
    secure_exchanges: int = 0  # FedMR App. B: secure layer exchanges among clients per round
    personal_weight: float = 0.5  # FML a: CE weight in the personal model's loss
    meme_weight: float = 0.5  # FML b: CE weight in the meme model's loss
    # FML: personal architecture(s), "name" or "a,b,..." (client i takes entry i mod n);
    # None: the shared model's (FML Fig. 5, model heterogeneity)
    personal_models: str | None = None
    # -- mutation-family baselines (FedExP, FedSAM/FedASAM, FedNTD, ...): issue 17
    fedexp_eps: float = 1e-3  # FedExP eps of the server step size (its CIFAR value)
    fedexp_average: bool = True  # FedExP: evaluate the mean of the last two iterates
    sam_rho: float | None = None  # FedSAM/FedASAM radius; None: 0.05 (SAM) / 0.5 (ASAM)
    asam_eta: float = 0.01  # FedASAM: T_w = |w| + eta (ASAM's default)
    # FedSAM/FedASAM's server-side SWA (Caldarola et al. Sec. 4; sam_rho 0 gives FedAvg + SWA)
    swa: bool = False
    swa_start: int | None = None  # first round of the SWA phase; None: after 75% of rounds
    swa_cycle: int = 1  # c: rounds per cycle of the learning rate and per averaged model
    swa_lr: float = 1e-4  # the cycle's lowest learning rate (the authors' code's default)
    ntd_beta: float = 1.0  # FedNTD distillation weight (authors' config)
    ntd_tau: float = 1.0  # FedNTD softmax temperature (authors' config)
    clusamp_distance: str = "cosine"  # CluSamp: arccos of the updates. cosine (FedQP's words)
    clusamp_sketch: int = 0  # CluSamp: 0 keeps whole updates (the paper); k: count sketches
    # FedGen (the authors' code's MNIST/EMNIST settings; it ships none for CIFAR)
    fedgen_alpha: float = 10.0  # weight of the generated-label cross-entropy (teacher) term
    fedgen_beta: float = 10.0  # weight of the generated-feature KL (latent) term
    fedgen_lr: float = 3e-4  # Adam learning rate of the server's generator
    fedgen_steps: int = 50  # generator steps per round (the code's 10 x 5)
    fedgen_batch: int = 32  # generated samples per local step (the code's gen_batch_size)
    # -- FedUp-table baselines (SCAFFOLD, FedDyn, ...): issue 12
    server_lr: float = 1.0  # SCAFFOLD global step size eta_g (the paper's experiments)
    feddyn_alpha: float = 0.01  # FedDyn alpha (the authors' CIFAR-10 example)
    smoo_alpha: float = 0.1  # FedSMOO: its dynamic regulariser's alpha (the authors' simulator)
    smoo_rho: float = 0.1  # FedSMOO: SAM radius rho (the authors' simulator)
    pvr_layers: int = 1  # FedPVR: layers with variance reduction, from the output (1: the head)
    moon_mu: float | None = None  # MOON mu; None: 5 on cifar10, 1 elsewhere (its Sec. 4.1)
    moon_tau: float = 0.5  # MOON temperature (its paper's value)
    mime_beta: float = 0.9  # MimeLite: the server's momentum beta (Mime's SGD + momentum runs)
    stem_a: float = 0.1  # STEM: a of d <- g(x) + (1 - a)(d - g(x_prev)); 1: plain SGD steps
    # bookkeeping
    seed: int = 0
    eval_every: int = 1
    eval_batch_size: int = 1000
    checkpoint_every: int = 10
    device: str = "auto"
    backend: str = "auto"
    # torch.compile of the vmap backend's training step: "off", or a torch.compile mode
    # ("default", "reduce-overhead" = CUDA graphs on a GPU, "max-autotune"). Costs a
    # compilation once per run (measured on a CPU: 20 s for the CNN to 4 min for the LSTM;
    # not yet on a GPU); see flnotes/engine/batched/stacked.py and benchmarks/README.md.
    compile: str = "off"
    record_states: bool = False  # keep every dispatched/local/global state (toy models)
    run_dir: str | None = None  # None: nothing written to disk

    def __post_init__(self) -> None:
        for problem in _problems(self):
            raise ValueError(problem)

    # ---- derived values -------------------------------------------------------
    def resolved(self) -> RunConfig:
        """A copy with every ``None`` default filled in for this algorithm and dataset."""
        from flnotes.algorithms import algorithm_class

        cls = algorithm_class(self.algorithm)
        changes: dict[str, Any] = {}
        if self.model is None:
            # A composed dataset ("cifar10+cifar100"): its first task's usual model.
            first = self.dataset.split("+")[0].strip()
            changes["model"] = DEFAULT_MODEL.get(first, "mlp")
        if self.weighting is None:
            changes["weighting"] = cls.default_weighting
        if self.alpha is None:
            changes["alpha"] = cls.default_alpha
        if self.client_test_fraction is None:
            changes["client_test_fraction"] = cls.default_client_test_fraction
        return dataclasses.replace(self, **changes)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def check_device(self) -> None:
        """Raise ValueError if this machine cannot run on ``device`` (e.g. 'cuda' without a GPU).

        Not part of validation on construction: a config written by a GPU run must still
        load on a CPU machine (to plot or tabulate it); only running it needs the device.
        """
        problem = _device_problem(self.device)
        if problem:
            raise ValueError(problem)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The config as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """Build from a dict; unknown keys are an error that lists the valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown RunConfig field(s) {unknown}; valid fields: {sorted(known)}"
            )
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> RunConfig:
        """A named preset (see flnotes.config.presets) with some fields overridden."""
        from flnotes.config.presets import preset_names, preset_values

        if name not in preset_names():
            raise ValueError(f"unknown preset {name!r}{did_you_mean(name, preset_names())}; "
                             "list them with `python -m flnotes presets`")
        values = preset_values(name)
        values.update(overrides)
        return cls.from_dict(values)


def model_names() -> list[str]:
    """Every model name a config may use: the registered architectures and the toy's
    2-parameter model (built by the toy's own task, :mod:`flnotes.toy.task`)."""
    from flnotes.models import model_names as registered

    return sorted(set(registered()) | {"toy"})


def field_names() -> list[str]:
    """Names of all RunConfig fields, in declaration order."""
    return [f.name for f in fields(RunConfig)]


def _problems(c: RunConfig):
    """Yield one message per invalid field: the field, the value and what is allowed."""
    from flnotes.algorithms import algorithm_names
    from flnotes.data.multitask import task_parts
    from flnotes.data.registry import composition_problem, dataset_names

    def bad(name: str, allowed: str) -> str:
        return f"RunConfig.{name}={getattr(c, name)!r} is invalid: {allowed}"

    # numpy scalars (a grid or a notebook's np.arange) are taken as the Python number they
    # hold: np.int64(2) is an int here, and the config stays JSON-able.
    for f in fields(c):
        value = getattr(c, f.name)
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
            object.__setattr__(c, f.name, value.item())
    if c.algorithm not in algorithm_names():
        yield bad("algorithm", f"registered algorithms are {algorithm_names()}"
                  + did_you_mean(c.algorithm, algorithm_names()))
    parts = task_parts(c.dataset)
    if parts is not None:  # "A+B": tasks for FML's objective heterogeneity (data/multitask.py)
        problem = composition_problem(c.dataset)
        if problem:
            yield bad("dataset", problem)
        elif c.algorithm != "fml":
            yield bad("dataset", "a composed dataset gives clients different tasks (FML's "
                      "objective heterogeneity, Fig. 6); only algorithm='fml' trains on it")
        elif c.partition == "natural":
            yield bad("partition", "a composed dataset splits each task among its clients: "
                      "use iid, dirichlet or shards")
        elif isinstance(c.num_clients, int) and c.num_clients < len(parts):
            yield bad("num_clients", f"{c.dataset!r} has {len(parts)} tasks and client i holds "
                      f"task i mod {len(parts)}: use at least one client per task")
    elif c.dataset not in dataset_names():
        yield bad("dataset", f"registered datasets are {dataset_names()}"
                  + did_you_mean(c.dataset, dataset_names()))
    if c.model is not None and c.model not in model_names():
        yield bad("model", f"registered models are {model_names()}"
                  + did_you_mean(c.model, model_names()))
    elif c.dataset == "toy" and c.model not in (None, "toy"):
        yield bad("model", "the toy dataset trains its own 2-parameter model ('toy'); leave "
                  "model unset (or 'toy')")
    elif c.model == "toy" and c.dataset != "toy":
        yield bad("model", "'toy' is the toy dataset's 2-parameter model; choose one of "
                  f"{sorted(set(model_names()) - {'toy'})}")
    if c.partition not in PARTITIONS:
        yield bad("partition", f"choose one of {list(PARTITIONS)}")
    if c.backend not in BACKENDS:
        yield bad("backend", f"choose one of {list(BACKENDS)}")
    if c.compile not in COMPILE_MODES:
        yield bad("compile", f"choose one of {list(COMPILE_MODES)}")
    elif c.compile != "off" and c.backend == "loop":
        yield bad("compile", "compiles the vmap backend's step; use backend='vmap' or 'auto'")
    if c.weighting is not None and c.weighting not in WEIGHTINGS:
        yield bad("weighting", f"choose one of {list(WEIGHTINGS)} (or None for the default)")
    if c.mutation not in MUTATIONS:
        yield bad("mutation", f"choose one of {list(MUTATIONS)}")
    if not isinstance(c.data_options, dict):
        yield bad("data_options", "must be a dict of loader options")
    else:
        from flnotes.data.options import data_option_problems

        for name in parts if parts is not None and not composition_problem(c.dataset) else [
                c.dataset]:  # a composed dataset's options go to every task's loader
            yield from data_option_problems(name, c.data_options)
    for name in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                 "eval_every", "eval_batch_size", "checkpoint_every", "beta_rounds",
                 "shards_per_client"):
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            yield bad(name, "must be a positive integer")
    for name in ("min_client_size", "stage1_rounds", "segments", "seed", "secure_exchanges"):
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            yield bad(name, "must be a non-negative integer")
    if isinstance(c.num_clients, int) and isinstance(c.clients_per_round, int):
        if c.clients_per_round > c.num_clients:
            yield (f"RunConfig.clients_per_round={c.clients_per_round} is invalid: it cannot "
                   f"exceed num_clients={c.num_clients}")
    for name in ("lr", "dirichlet_alpha"):
        if not _is_number(getattr(c, name)) or getattr(c, name) <= 0:
            yield bad(name, "must be a positive finite number")
    for name in ("weight_decay", "mu", "alpha"):
        value = getattr(c, name)
        if value is not None and (not _is_number(value) or value < 0):
            yield bad(name, "must be a non-negative finite number")
    if c.personal_models is not None:
        from flnotes.models import model_names as architectures

        names = c.personal_models.split(",") if isinstance(c.personal_models, str) else [None]
        unknown = [n.strip() for n in names if not n or n.strip() not in architectures()]
        if unknown or not isinstance(c.personal_models, str):
            yield bad("personal_models", "one model name or a comma-separated list of "
                      f"{architectures()}" + did_you_mean(str(unknown[0] if unknown else ""),
                                                          architectures()))
    if not _is_number(c.momentum) or not 0 <= c.momentum < 1:
        yield bad("momentum", "must be in [0, 1)")
    for name in ("beta0", "qp_prob", "personal_weight", "meme_weight"):
        value = getattr(c, name)
        if not _is_number(value) or not 0 <= value <= 1:
            yield bad(name, "must be in [0, 1]")
    if c.client_test_fraction is not None and (
        not _is_number(c.client_test_fraction) or not 0 <= c.client_test_fraction < 1
    ):
        yield bad("client_test_fraction", "must be in [0, 1) (or None for the default)")
    if not isinstance(c.device, str) or not _valid_device(c.device):
        yield bad("device", "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    # FedUp-table baselines (issue 12)
    if not _is_number(c.server_lr) or c.server_lr <= 0:
        yield bad("server_lr", "must be a positive finite number (1: the clients' mean)")
    if not _is_number(c.feddyn_alpha) or c.feddyn_alpha < 0:
        yield bad("feddyn_alpha", "must be a non-negative finite number")
    for name in ("smoo_alpha", "smoo_rho"):
        if not _is_number(getattr(c, name)) or getattr(c, name) < 0:
            yield bad(name, "must be a non-negative finite number")
    if not _is_number(c.mime_beta) or not 0 <= c.mime_beta < 1:
        yield bad("mime_beta", "must be in [0, 1)")
    if not _is_number(c.stem_a) or not 0 < c.stem_a <= 1:
        yield bad("stem_a", "must be in (0, 1]")
    if _is_number(c.momentum) and c.momentum != 0 and c.algorithm in algorithm_names():
        from flnotes.algorithms import algorithm_class

        if algorithm_class(c.algorithm).own_momentum:
            yield bad("momentum", f"must be 0 for {c.algorithm}: it brings its own momentum "
                      "(MimeLite: mime_beta, the server's; STEM: stem_a), the local SGD none")
    if c.moon_mu is not None and (not _is_number(c.moon_mu) or c.moon_mu < 0):
        yield bad("moon_mu", "must be a non-negative finite number (or None for the default)")
    if not _is_number(c.moon_tau) or c.moon_tau <= 0:
        yield bad("moon_tau", "must be a positive finite number")
    if not isinstance(c.pvr_layers, int) or isinstance(c.pvr_layers, bool) or c.pvr_layers < 0:
        yield bad("pvr_layers", "must be an integer >= 0 (0: FedAvg; every layer: SCAFFOLD)")
    # mutation-family baselines (issue 17)
    for name in ("fedexp_eps", "ntd_tau"):
        if not _is_number(getattr(c, name)) or getattr(c, name) <= 0:
            yield bad(name, "must be a positive finite number")
    for name in ("sam_rho", "asam_eta", "ntd_beta"):
        value = getattr(c, name)
        if (value is not None or name != "sam_rho") and (not _is_number(value) or value < 0):
            yield bad(name, "must be a non-negative finite number"
                      + (" (or None for the default)" if name == "sam_rho" else ""))
    if not isinstance(c.fedexp_average, bool):
        yield bad("fedexp_average", "must be true or false")
    if not isinstance(c.swa, bool):
        yield bad("swa", "must be true or false")
    elif c.swa and c.algorithm not in ("fedsam", "fedasam"):
        yield bad("swa", "is FedSAM's server-side averaging: use algorithm fedsam or fedasam "
                  "(fedsam with sam_rho 0 is FedAvg + SWA)")
    if c.swa_start is not None and (not isinstance(c.swa_start, int)
                                    or isinstance(c.swa_start, bool) or c.swa_start < 1):
        yield bad("swa_start", "must be a round number >= 1 (or None: after 75% of the rounds)")
    if not isinstance(c.swa_cycle, int) or isinstance(c.swa_cycle, bool) or c.swa_cycle < 1:
        yield bad("swa_cycle", "must be an integer >= 1")
    if not _is_number(c.swa_lr) or c.swa_lr <= 0:
        yield bad("swa_lr", "must be a positive finite number")
    for name in ("fedgen_alpha", "fedgen_beta"):
        if not _is_number(getattr(c, name)) or getattr(c, name) < 0:
            yield bad(name, "must be a non-negative finite number (0 turns the term off)")
    if not _is_number(c.fedgen_lr) or c.fedgen_lr <= 0:
        yield bad("fedgen_lr", "must be a positive finite number")
    for name, low in (("fedgen_steps", 0), ("fedgen_batch", 1)):
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            yield bad(name, f"must be an integer >= {low}")
    if c.clusamp_distance not in ("cosine", "l1", "l2"):
        yield bad("clusamp_distance", "must be one of cosine, l1, l2")
    if not isinstance(c.clusamp_sketch, int) or isinstance(c.clusamp_sketch, bool) \
            or c.clusamp_sketch < 0:
        yield bad("clusamp_sketch", "must be a non-negative integer (0: whole updates)")
    elif c.clusamp_sketch > 0 and c.clusamp_distance == "l1":
        yield bad("clusamp_sketch", "a count sketch keeps cosine and l2 distances, not l1")


def _is_number(value: Any) -> bool:
    """A finite int or float: NaN and inf pass every comparison-based range check wrongly."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _device_problem(device: str) -> str | None:
    """Why this machine cannot run on a (well-formed) device, or None if it can."""
    import torch

    if device == "auto":
        return None
    target = torch.device(device)
    if target.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return (f"RunConfig.device={device!r} is invalid on this machine: "
                "torch.cuda.is_available() is False; use --device cpu or auto")
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        return (f"RunConfig.device={device!r} is invalid on this machine: it has {count} CUDA "
                f"device(s), cuda:0 to cuda:{count - 1}; use one of them, cuda or auto")
    return None


def _valid_device(device: str) -> bool:
    if device == "auto":
        return True
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return False
    return True
