"""Named presets: the settings each paper states (and the official code's, where different).

A preset is a dict of RunConfig fields; ``RunConfig.from_preset(name, **overrides)``
builds the config. Each preset's docstring cites where every value comes from.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

PRESETS: dict[str, Callable[[], dict[str, Any]]] = {}
# Which of the seed authors' repositories ran a preset's paper (None: neither), and whether
# the preset runs the baselines as that code did ("seed-code") or as their own papers.
SEED_REPOSITORY: dict[str, str | None] = {}
BASELINE_READING: dict[str, str] = {}
# Where a preset's input scaling comes from, said after the scaling itself (describe)
NOT_SAID = "the paper does not say how it scales inputs"
INPUTS_SOURCE: dict[str, str | None] = {}
DATASET_LABELS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "mnist": "MNIST",
                  "fashion_mnist": "Fashion-MNIST"}


def preset(name: str, repository: str | None = None, reading: str = "paper",
           inputs: str | None = NOT_SAID):
    """Register a function returning a preset's field values under ``name``; ``repository``
    is the seed authors' repository whose code ran the paper's tables, ``reading`` how the
    preset runs the baselines ("paper" or "seed-code"), ``inputs`` where its input scaling
    comes from (after the scaling :func:`describe` writes from the values; None: nothing)."""

    def register(fn: Callable[[], dict[str, Any]]):
        PRESETS[name] = fn
        SEED_REPOSITORY[name] = repository
        BASELINE_READING[name] = reading
        INPUTS_SOURCE[name] = inputs
        return fn

    return register


def preset_names() -> list[str]:
    """Names of every preset."""
    return sorted(PRESETS)


def preset_values(name: str) -> dict[str, Any]:
    """The RunConfig fields of a preset (a fresh dict each call)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {preset_names()}")
    return dict(PRESETS[name]())


def summary(name: str) -> str:
    """A preset's one-line description: the first sentence of its docstring, one line."""
    first = describe(name).split("\n\n")[0]
    return " ".join(first.split())


# What a preset's model is where it differs from the seed code's, said once for every preset
# that trains it (describe)
MODEL_NOTES = {
    "vgg16": 'VGG-16 here ("vgg16", flnotes/models.py) is the 13-conv VGG with BatchNorm and '
             "one linear layer on its 512 features, as the common CIFAR VGG; the official "
             "FedMut/FedMR code's head is 512-4096-4096-classes with dropout, which this one "
             "leaves out (a 4096-wide head on a 1x1 feature map adds about 19M parameters).",
}


def describe(name: str) -> str:
    """A preset's docstring (where each of its values comes from), then what its model is
    where the seed code's differs, then how its inputs are scaled, written from its dataset
    and data options, and where that comes from."""
    values = preset_values(name)
    doc = inspect.cleandoc(PRESETS[name].__doc__ or "")
    if values.get("model") in MODEL_NOTES:
        doc += "\n\n" + textwrap.fill(MODEL_NOTES[values["model"]], 92)
    scaling = input_scaling(values)
    if scaling is None or "Inputs scaled" in doc:  # the seed-code presets say it their way
        return doc
    source = INPUTS_SOURCE.get(name)
    joint = ", " if source and source.startswith("as ") else "; "  # "as the code's ..."
    wrapped = textwrap.fill(f"Inputs: {scaling}" + (f"{joint}{source}." if source else "."), 92)
    return f"{doc}\n\n{wrapped}"


def input_scaling(values: dict[str, Any]) -> str | None:
    """How a preset's dataset scales its inputs (None: the synthetic smoke task's)."""
    tasks = values.get("dataset", "synthetic").split("+")
    if len(tasks) > 1:
        return ("each task's channels standardised with its own dataset's mean and std (data "
                'option normalize="dataset", the default, applied to both loaders)')
    if tasks[0] == "femnist":
        return ("LEAF's FEMNIST pixels as its JSON stores them (grey values / 255, in [0, 1]: "
                "LEAF's preprocess/data_to_json.py), not standardised: the FEMNIST loader has no "
                "normalize option")
    if tasks[0] == "shakespeare":
        return ("windows of 80 character ids that the LSTM's embedding looks up; there are no "
                "pixel values, so no normalize option applies")
    if tasks[0] == "synthetic":
        return None
    rule = (values.get("data_options") or {}).get("normalize", "dataset")
    if rule != "dataset":
        return f'scaled as data option normalize="{rule}" scales them'
    label = DATASET_LABELS.get(tasks[0], "the dataset")
    return (f"each channel standardised with {label}'s own mean and std (data option "
            'normalize="dataset", the default)')


@preset("demo")
def demo() -> dict[str, Any]:
    """Quick-start smoke run: synthetic 28x28 task, MLP, 20 clients (10 per round).

    Values chosen to finish in well under a minute on two CPU cores; they come from no
    paper. Dirichlet 0.5 gives moderate label skew.
    """
    return dict(algorithm="fedavg", dataset="synthetic", model="mlp", partition="dirichlet",
                dirichlet_alpha=0.5, num_clients=20, clients_per_round=10, rounds=15,
                local_epochs=1, batch_size=50, lr=0.05, momentum=0.5)


# ---- paper settings -----------------------------------------------------------------------
# A paper preset holds the settings of the paper's whole experimental setup, not only the
# proposed method's: ``RunConfig.from_preset("fedmut-paper", algorithm="fedprox")`` is the
# paper's FedProx baseline. Fields a paper does not state keep RunConfig's defaults unless
# the docstring says otherwise; weighting stays None (each algorithm's own default) unless
# the paper writes one aggregation for every method.
def _mutation_setup() -> dict[str, Any]:
    """Settings shared by the FedMut/FedQP/FedMR papers (same group, same testbed)."""
    return dict(dataset="cifar10", model="cnn", partition="dirichlet", dirichlet_alpha=0.5,
                num_clients=100, clients_per_round=10, local_epochs=5, batch_size=50, lr=0.01)


@preset("fedmut-paper", repository="FedMut")
def fedmut_paper() -> dict[str, Any]:
    """FedMut (AAAI 2024) Table 1, CNN on CIFAR-10, as the paper text states it.

    From the paper ("Settings" and "Comparison of Accuracy"): SGD lr 0.01, momentum 0.9,
    batch size 50, 5 local epochs; alpha = 4.0 for all of Table 1; beta0 = 0.3 for CNN and
    VGG-16 (0.5 for ResNet-18: preset fedmut-paper-resnet18); FedProx mu = 0.01; Dirichlet
    d in {0.1, 0.5, 1.0} or IID. Not in the paper, chosen here: 100 clients with 10 per
    round (what FedQP and FedMR, by the same group on the same testbed, state); T_b = 50
    (official code, --mut_bound 50); d = 0.5 (the middle of Table 1's settings; override
    dirichlet_alpha); 2000 rounds (the paper gives no round count; the official code's
    default is --epochs 2000).

    Measured (2026-11-22, CIFAR-10 from the JPEG copy, CPU, seed 0): at this preset FedMut
    diverged in round 3 (train loss NaN) while FedAvg reached 25.9% at round 4; with the
    official code's momentum 0.5 (``--momentum 0.5``, or preset fedmut-official) FedMut
    stayed stable (21.0% at round 6). Mutants sit alpha = 4 times the last global update
    away, and momentum 0.9 makes that update large: the two feed each other (in a smaller
    run, fc2's |g| / |w| grew from 0.15 to 0.32 in one round before the NaN). The inputs
    decide how close to that edge a run sits (a check on 2026-11-25, CIFAR-10 JPEG, the
    code's LeNet, IID, momentum 0.9, 15 rounds): on these standardised inputs flnotes
    diverged on 3 of 4 seeds and the seed authors' own FedMut code, fed the same pixels, on 1
    of 2; on the code's inputs,
    Normalize(0.5, 0.5), which are half as large, both stay finite on most seeds (flnotes 4 of
    6, the seed code 5 of 6 here and in the reviewer's check). So the paper's momentum 0.9 is
    usable with the code's input scaling (--data-option normalize=fedmut-code); run both when
    reproducing Table 1.
    """
    return dict(_mutation_setup(), algorithm="fedmut", momentum=0.9, rounds=2000, alpha=4.0,
                beta0=0.3, beta_rounds=50, mu=0.01)


@preset("fedmut-paper-resnet18", repository="FedMut")
def fedmut_paper_resnet18() -> dict[str, Any]:
    """FedMut (AAAI 2024) Table 1 with ResNet-18: as fedmut-paper but beta0 = 0.5.

    beta0 = 0.5 for ResNet-18 is stated in "Comparison of Accuracy"; every other value and
    choice is fedmut-paper's (see its docstring).
    """
    return dict(fedmut_paper(), model="resnet18", beta0=0.5)


@preset("fedmut-paper-vgg16", repository="FedMut")
def fedmut_paper_vgg16() -> dict[str, Any]:
    """FedMut (AAAI 2024) Table 1 with VGG-16: as fedmut-paper (beta0 = 0.3, as for the CNN).

    "Comparison of Accuracy" gives beta0 = 0.3 for the CNN and VGG-16, 0.5 for ResNet-18.
    """
    return dict(fedmut_paper(), model="vgg16", beta0=0.3)


# The seed authors' two public repositories run the seed tables' baselines. The FedMR
# repository picks FedGen's values by dataset (Algorithm/Training_FedGen.py l.24-35 read
# utils/model_config.py's FedGenRUNCONFIGS[args.dataset]); the FedMut repository's copy of
# the same file hard-codes dataset_name = 'cifar10' (its l.24), so FedMut's tables ran
# CIFAR-10's values on every dataset.
SEED_REPOSITORIES = ("FedMut", "FedMR")
# FedGenRUNCONFIGS (FedMR repository utils/model_config.py l.58-97): generative_alpha,
# generative_beta, ensemble_lr per dataset. A dataset it has no entry for (the code would
# stop with a KeyError) takes CIFAR-10's values.
# An ensemble_lr of 3e-4 is FedGen's default already and is left out, so that a grid cell
# whose settings do not change keeps its id.
_SEED_CODE_FEDGEN = {
    "cifar10": dict(fedgen_alpha=0.2, fedgen_beta=0.2),
    "cifar100": dict(fedgen_alpha=10.0, fedgen_beta=1.0, fedgen_lr=1e-4),
    "femnist": dict(fedgen_alpha=10.0, fedgen_beta=10.0),
}


def seed_code_baselines(dataset: str | None = "cifar10",
                        repository: str = "FedMR") -> dict[str, Any]:
    """The baselines as the seed papers' authors ran them (their FedMR repository, which holds
    FedExP, FedASAM, FedGen, FedProx, FedMut and Indep, and the FedMut repository; files and
    lines below), for the ``*-official`` presets and ``baselines: seed-code`` in a grid. The
    ``*-paper`` presets keep each baseline's own paper.

    Aggregation weights are not set here: each method's own default is what the seed code
    does (FedMut, FedQP, FedMR average uniformly, ``Aggregation(w_locals, None)`` in
    Training_FedMut.py; FedAvg, FedProx, CluSamp, FedGen and FedASAM weight by client size,
    ``Aggregation(w_locals, lens)`` in main_fed.py l.56, 95, 160, Training_FedGen.py l.110,
    Training_FedASAM.py l.132; FedExP's p_i are data shares, Training_FedExP.py l.31-36), and
    ``weighting`` is one field for every method: setting it here would give every baseline
    FedMut's uniform mean.

    FedExP: eps = 0.1 added once per client (Algorithm/Training_FedExP.py l.83); FedASAM:
    rho 0.1, eta 0 (hard-coded in Algorithm/Training_FedASAM.py); FedGen: alpha, beta and the
    generator's Adam learning rate by ``dataset`` in the FedMR repository (CIFAR-10 0.2 / 0.2
    / 3e-4, CIFAR-100 10 / 1 / 1e-4, FEMNIST 10 / 10 / 3e-4: utils/model_config.py l.58-97),
    CIFAR-10's in the FedMut repository (``repository="FedMut"``: it hard-codes 'cifar10'),
    no decay, uniform noise of 100 numbers, a new Adam each round, 128 generated samples per
    step with gen_ratio 1, label shares from each client's data, the teacher loss's
    (B,)*(B,1) broadcast (flnotes/algorithms/fedgen.py lists each line); FedMut in the FedMR
    repository: --radius 5.0, --mut_bound 100 (its utils/options.py); CluSamp: --sim_type
    L1 (utils/options.py), the drawn clients averaged by size (main_fed.py l.152-160) and the
    code's one-entry-per-client similarity update (utils/clustering.py l.118-130;
    flnotes/algorithms/clusamp.py says how); FedProx: --prox_alpha 0.01 with (mu/2)||w -
    w_g||^2, as FedProx's paper. A method's settings apply only when that method runs
    (FedASAM's rho reaches FedSAM too if FedSAM is run from such a preset).
    """
    if repository not in SEED_REPOSITORIES:
        raise ValueError(f"unknown seed repository {repository!r}; one of {SEED_REPOSITORIES}")
    fedgen = _SEED_CODE_FEDGEN["cifar10" if repository == "FedMut" else dataset] \
        if dataset in _SEED_CODE_FEDGEN else _SEED_CODE_FEDGEN["cifar10"]
    # FedMut as a baseline of FedMR's table: that repository's defaults (utils/options.py
    # --radius 5.0, --mut_bound 100); the FedMut repository's are FedMut's paper values.
    fedmut = dict(alpha=5.0, beta_rounds=100) if repository == "FedMR" else {}
    return dict(**fedmut, fedexp_eps=0.1, fedexp_eps_per_client=True, sam_rho=0.1, asam_eta=0.0,
                **fedgen, fedgen_decay=1.0, fedgen_noise="uniform",
                fedgen_noise_dim=100, fedgen_fresh_optimizer=True, fedgen_server_batch=128,
                fedgen_batch=128, fedgen_ratio_scaling=False, fedgen_label_counts="data",
                fedgen_teacher_weighting="mean-product", clusamp_distance="l1",
                clusamp_aggregation="samples", clusamp_similarity="seed-code", mu=0.01)


@preset("fedmut-official", repository="FedMut", reading="seed-code")
def fedmut_official() -> dict[str, Any]:
    """FedMut's official code (github.com/HMHelloWorld/FedMut, utils/options.py) defaults.

    Where the code differs from the paper text: momentum 0.5 (--momentum), the LeNet-style
    CNNCifar model ("lenet-cifar"); FedMut averages uniformly (Aggregation(w_locals, None), its
    default weighting) and the baselines by client size (Aggregation(w_locals, lens)), each
    method's own default (no ``weighting`` here: seed_code_baselines says why).
    Also from the code: 100 clients (--num_users), 10% per round (--frac 0.1), 5 local
    epochs, batch 50, lr 0.01, alpha 4.0 (--radius), beta0 0.3 (--mut_acc_rate), T_b 50
    (--mut_bound), FedProx mu 0.01 (--prox_alpha), Dirichlet 0.5 (--data_beta), 2000 rounds
    (--epochs). CIFAR-100 with the code's 20 coarse labels: fedmut-official-cifar100.
    Every baseline of FedMut's Table 1 as the seed authors' code runs it (FedGen, CluSamp,
    FedProx: seed_code_baselines; fedmut-paper keeps each baseline's own paper).

    Momentum: the FedMut paper says 0.9. At 0.9 with these inputs FedMut mostly stays finite,
    as the seed code does (CIFAR-10 JPEG, IID, 15 rounds, seeds 0-5, 2026-11-25:
    flnotes finite on 4 of 6 seeds, 40.4-43.2% at round 15, seeds 3 and 5 NaN in round 14;
    the seed authors' FedMut code on the same pixels 5 of 6, 39.1-41.8%, seed 3 NaN by round
    10; a reviewer's own check 5 of 6). On per-channel standardised inputs, about twice as
    large, both diverge more often (flnotes 3 of 4 seeds, the seed code 1 of 2). A reported
    "flnotes diverges on 6 of 6" came from the command line dropping this preset's normalize
    option, so flnotes ran on the standardised inputs (fixed, tests/test_cli.py).

    Inputs scaled as the code scales them (utils/get_dataset.py): data option
    normalize="fedmut-code", i.e. Normalize((0.5,)*3, (0.5,)*3) on CIFAR-10. A side-by-side
    run with the official code on the same pixels and split (CNNCifar, 50 rounds; a
    reviewer's check) found the default per-channel standardisation learning markedly faster in the
    early rounds (FedMut at round 20: 43.1% against the code's 35.7%), and the code's scaling
    following the official curves within their seed spread (37.0%).
    """
    return dict(_mutation_setup(), **seed_code_baselines("cifar10", "FedMut"), algorithm="fedmut",
                model="lenet-cifar", momentum=0.5, rounds=2000, alpha=4.0,
                beta0=0.3, beta_rounds=50, data_options={"normalize": "fedmut-code"})


@preset("fedmut-official-cifar100", repository="FedMut", reading="seed-code")
def fedmut_official_cifar100() -> dict[str, Any]:
    """fedmut-official on CIFAR-100 with the 20 coarse labels the official code trains on.

    The official README says to set --num_classes 20 for CIFAR-100, i.e. superclasses;
    data_options={"coarse": True} asks the loader for them. Everything else: fedmut-official.

    Inputs scaled as the code scales CIFAR-100 (utils/get_dataset.py): data option
    normalize="fedmut-code", i.e. Normalize with CIFAR-10's channel means and the std
    (0.2023, 0.1994, 0.2010), not CIFAR-100's own statistics (kept as the code has it, so
    that a run compares with the code on the same inputs; fedmut-official says why).
    """
    return dict(fedmut_official(), dataset="cifar100",
                data_options={"coarse": True, "normalize": "fedmut-code"})


@preset("fedqp-official", repository="FedMut", reading="seed-code")
def fedqp_official() -> dict[str, Any]:
    """FedQP (SEKE 2024) Table I as the seed authors' code would run it: fedmut-official with
    algorithm fedqp.

    FedQP's authors published no code; FedQP extends FedMut's (the same group), so this is the
    FedMut official code's setting (lenet-cifar, momentum 0.5, FedQP averaging uniformly as
    FedMut does and the baselines by size, T_b 50,
    beta0 0.3, 2000 rounds) with FedQP's mutation range and projection probability left to
    flnotes' FedQP defaults (alpha 2.0, p 0.5: the paper gives neither; fedqp-paper says
    how they were chosen) and every baseline as the seed code runs it (seed_code_baselines:
    FedGen, CluSamp, FedNTD has no seed-code implementation and keeps its paper's).

    Inputs scaled as the FedMut code scales them: normalize="fedmut-code".
    """
    values = dict(fedmut_official(), algorithm="fedqp", qp_prob=0.5)
    del values["alpha"]  # FedQP's own default, not FedMut's radius
    return values


@preset("fedmr-official", repository="FedMR", reading="seed-code")
def fedmr_official() -> dict[str, Any]:
    """FedMR (KDD 2024) Table 1 as the seed authors' code runs it (their FedMR repository,
    utils/options.py defaults and the Algorithm/ files).

    From the code: 500 rounds (--epochs), 100 clients with 10% per round, 5 local epochs,
    batch 50, SGD lr 0.01 with momentum 0.5 (the paper says 0.9), the LeNet-style CNNCifar
    ("lenet-cifar") for the CNN column, FedMR and FedMut averaging uniformly and the
    baselines by client size (each method's default weighting), Dirichlet 0.5 (--data_beta),
    FedProx mu 0.01 (--prox_alpha); FedMut as that repository's defaults run it (--radius 5.0,
    --mut_acc_rate 0.3, --mut_bound 100); the baselines as seed_code_baselines says.
    Two-stage bound: the code recombines after round index iter >= --first_stage_bound
    (0-based), so its first recombined round is bound + 2 (1-based) and flnotes'
    stage1_rounds = bound + 1 (rounds <= stage1_rounds train from the global model); at the
    default bound 0 both recombine from round 2 (stage1_rounds 0 or 1 are the same run).
    fedmr-official-resnet20 and -vgg16 use the paper's 100-round first stage as the code's
    bound 100, i.e. stage1_rounds = 101.

    Inputs scaled as the code scales them (utils/get_dataset.py): normalize="fedmut-code".
    """
    return dict(_mutation_setup(), **seed_code_baselines("cifar10", "FedMR"), algorithm="fedmr",
                model="lenet-cifar", momentum=0.5, rounds=500,
                stage1_rounds=0, segments=0, beta0=0.3,
                data_options={"normalize": "fedmut-code"})


@preset("fedmr-official-resnet20", repository="FedMR", reading="seed-code")
def fedmr_official_resnet20() -> dict[str, Any]:
    """fedmr-official with ResNet-20 and the official code's --first_stage_bound 100 for the
    paper's 100-round first stage (Section 5.1); stage1_rounds 101: fedmr-official says why
    the two conventions differ by one.

    Inputs scaled as the code scales them: normalize="fedmut-code".
    """
    return dict(fedmr_official(), model="resnet20", stage1_rounds=101)


@preset("fedmr-official-vgg16", repository="FedMR", reading="seed-code")
def fedmr_official_vgg16() -> dict[str, Any]:
    """fedmr-official with VGG-16 and the official code's --first_stage_bound 100 (Section
    5.1's first stage; stage1_rounds 101).

    Inputs scaled as the code scales them: normalize="fedmut-code".
    """
    return dict(fedmr_official(), model="vgg16", stage1_rounds=101)


@preset("fedqp-paper", repository="FedMut")
def fedqp_paper() -> dict[str, Any]:
    """FedQP (SEKE 2024) Table I, CNN on CIFAR-10, as Section IV-A states it.

    From the paper: SGD lr 0.01, momentum 0.5 (not FedMut's 0.9), batch size 50, 5 local
    epochs, 100 devices with 10 per round (Table II varies K in {5, 10, 20}); Dir(beta)
    with beta in {0.1, 0.5, 1.0} or IID. Not in the paper, chosen here: p = 0.5 and
    FedQP's alpha = 2.0 (the paper says p must be tuned per model and dataset and gives
    neither value; the scan below); beta0 = 0.3, T_b = 50 (FedQP applies FedMut's mutation
    before projecting and gives no values: FedMut's paper and code values); 2000 rounds
    (as fedmut-paper: the FedMut code that FedQP extends defaults to 2000, the paper gives
    no count); FedProx mu = 0.01 (FedMut's, for a FedProx run on this setup). alpha is left
    to each method's default, so FedMut's column of the same tables runs its paper's 4.0.

    The p x alpha scan (benchmarks/fedqp_scan.yaml; CIFAR-10 JPEG copy, this CNN, Dir(0.5),
    this preset cut to 5 clients per round, 1 local epoch, 12 rounds, seed 0; CPU, 2026-11-24).
    Test accuracy (%) at rounds 6 / 9 / 12, and the largest round train loss:

        p  alpha=   1.0                      2.0                      4.0
        0 (FedMut)  16.1 / 20.9 / 20.1, 2.03  16.3 / 25.7 / 20.6, 2.03  13.6 / 15.7 / 18.6, 2.64
        0.5         17.5 / 22.2 / 20.5, 2.03  20.6 / 26.3 / 23.2, 2.03  17.0 / 14.8 / 20.3, 2.46
        1.0         19.0 / 22.7 / 22.0, 2.03  22.3 / 26.3 / 25.9, 2.03  16.2 / 10.6 / 10.0, 5.30

    At alpha = 4 the p = 1 run blows up (train loss 2.3 -> 5.3, chance accuracy) and p = 0.5
    falls back between rounds 6 and 9; at alpha <= 2 no round's train loss exceeds round 1's
    (2.03), and alpha = 2 gives the best accuracy at rounds 9 and 12 for p = 0.5 and p = 1.
    p = 0.5 keeps a margin from the unstable corner (a larger p pushes the mean mutant
    further ahead of the global model).
    Twelve short rounds cannot show late-round divergence: at paper scale, watch the loss.
    """
    return dict(_mutation_setup(), algorithm="fedqp", momentum=0.5, rounds=2000, qp_prob=0.5,
                mutation="sign", beta0=0.3, beta_rounds=50, mu=0.01)


@preset("fedqp-paper-resnet18", repository="FedMut")
def fedqp_paper_resnet18() -> dict[str, Any]:
    """FedQP (SEKE 2024) Table II / ablation setting: ResNet-18, CIFAR-10, beta = 0.5.

    Table II and Fig. 4 use ResNet-18 on CIFAR-10 with Dir(0.5) and K = 10 by default. beta0 =
    0.5 is FedMut's ResNet-18 value (FedQP states none). Everything else: fedqp-paper.
    """
    return dict(fedqp_paper(), model="resnet18", beta0=0.5)


@preset("fedqp-paper-vgg16", repository="FedMut")
def fedqp_paper_vgg16() -> dict[str, Any]:
    """FedQP (SEKE 2024) Table I with VGG-16: as fedqp-paper (beta0 = 0.3, FedMut's value)."""
    return dict(fedqp_paper(), model="vgg16", beta0=0.3)


@preset("fedmr-paper", repository="FedMR")
def fedmr_paper() -> dict[str, Any]:
    """FedMR (KDD 2024) Section 5.1, CNN on CIFAR-10 (recombination from round 1).

    From the paper: 100 clients for CIFAR-10/100, 10% active per round, SGD lr 0.01,
    momentum 0.9, batch size 50, 5 local epochs; the CNN (McMahan et al.) is recombined
    from the start (no pre-training stage); FedProx mu = 0.01 on CIFAR-10 (0.001 on
    CIFAR-100, 0.1 on FEMNIST: override mu). Not in the paper, chosen here: Dirichlet 0.5
    (the alpha of the quoted setting is blank in the text; the official code's --data_beta
    default), 500 rounds (official code's default --epochs 500, github.com/HMHelloWorld/FedMR),
    one segment per layer (plain FedMR, not FedMR-p).
    """
    return dict(_mutation_setup(), algorithm="fedmr", momentum=0.9, rounds=500,
                stage1_rounds=0, segments=0, mu=0.01)


@preset("fedmr-paper-resnet20", repository="FedMR")
def fedmr_paper_resnet20() -> dict[str, Any]:
    """FedMR (KDD 2024) with ResNet-20: two-stage training, 100 rounds of FedAvg first.

    Section 5.1: ResNet-20 and VGG-16 use the two-stage scheme whose first stage lasts 100
    rounds (as in the Fig. 9 learning curves). Everything else: fedmr-paper.
    """
    return dict(fedmr_paper(), model="resnet20", stage1_rounds=100)


@preset("fedmr-paper-vgg16", repository="FedMR")
def fedmr_paper_vgg16() -> dict[str, Any]:
    """FedMR (KDD 2024) with VGG-16: two-stage training, 100 rounds of FedAvg first.

    Section 5.1 (two-stage for ResNet-20 and VGG-16, first stage 100 rounds). Everything
    else: fedmr-paper.
    """
    return dict(fedmr_paper(), model="vgg16", stage1_rounds=100)


@preset("fedmr-paper-cifar100", repository="FedMR")
def fedmr_paper_cifar100() -> dict[str, Any]:
    """FedMR (KDD 2024) Table 1 on CIFAR-100 with the CNN: FedProx mu = 0.001.

    Section 5.1: 100 clients for CIFAR-100 as for CIFAR-10, FedProx's best mu per data set
    0.01 / 0.001 / 0.1 for CIFAR-10 / CIFAR-100 / FEMNIST. Everything else: fedmr-paper.
    """
    return dict(fedmr_paper(), dataset="cifar100", mu=0.001)


@preset("fedmr-paper-femnist", repository="FedMR")
def fedmr_paper_femnist() -> dict[str, Any]:
    """FedMR (KDD 2024) Table 1 on FEMNIST: 180 writers with over 100 samples each.

    Section 5.1: FEMNIST's own non-IID split (no Dirichlet), "180 clients, where each client
    hosts more than 100 local data samples"; FedProx mu = 0.1; 10% of the clients per round
    as for CIFAR (18). Chosen here: the 180 writers are a fixed random subset (subset_seed 0)
    of LEAF's writers with at least 101 training samples (data options max_writers 180,
    min_samples 101); the McMahan CNN on 28x28 inputs (the paper's "CNN" column; its
    FEMNIST CNN is not described). Everything else: fedmr-paper.
    """
    return dict(fedmr_paper(), dataset="femnist", model="cnn", partition="natural",
                num_clients=180, clients_per_round=18, mu=0.1,
                data_options={"max_writers": 180, "min_samples": 101})


@preset("fml-paper")
def fml_paper() -> dict[str, Any]:
    """FML (FITEE 2023) Table 1 setting on CIFAR-10: K = 5 clients, shards, all take part.

    From the paper: K = 5 clients; non-IID data cut into K*p shards of n/(K*p) samples,
    p per client; every client runs each round (Alg. 1 l.2, "for each client k"); the
    server takes the plain mean of the meme models (Alg. 1 l.5, weighting uniform). The
    letter gives nothing else, so these come from the official code
    (github.com/ZJU-DAI/Federated-Mutual-Learning, Args.py and Node.py): SGD lr 0.01,
    momentum 0.9, weight decay 5e-4, batch 128, 5 local epochs, a = b = 0.5, a 10% private
    validation share per client (val_ratio 0.1). Chosen here: p = 2 shards per client (the
    p of levels (1)-(3) is not given; 2 is McMahan et al.'s pathological split, the hardest
    kind; raise shards_per_client for milder levels); the McMahan CNN for CNN1 (the letter
    does not define CNN1/CNN2); 100 rounds (Fig. 5 plots the first 100 rounds). The
    official code's step learning-rate decay has no RunConfig field and is not applied.
    """
    return dict(algorithm="fml", dataset="cifar10", model="cnn", partition="shards",
                shards_per_client=2, num_clients=5, clients_per_round=5, rounds=100,
                local_epochs=5, batch_size=128, lr=0.01, momentum=0.9, weight_decay=5e-4,
                weighting="uniform", personal_weight=0.5, meme_weight=0.5,
                client_test_fraction=0.1)


@preset("fml-fig6", inputs=f"{NOT_SAID}. Needs both datasets in data_dir (CIFAR-100 as its "
                           "pickles)")
def fml_fig6() -> dict[str, Any]:
    """FML (FITEE 2023) Fig. 6, objective heterogeneity: CIFAR-10 clients beside CIFAR-100.

    From the paper (Fig. 6 caption): LeNet5 and CNN1 models trained on CIFAR-10 and
    CIFAR-100 respectively, with FML and independently; the first 250 rounds. The
    independent curves are this preset with ``personal_weight=1.0`` (each personal model
    then trains on its own client alone). Chosen here, where the letter is silent:
    ``dataset="cifar10+cifar100"``, one joint label space (CIFAR-100's classes numbered
    10-109) in which the shared model has 110 outputs and each client's meme is read on its
    task's slice (decisions in flnotes/algorithms/fml.py); 2 clients, one per task (the
    caption's "two models", each trained on its whole dataset; client i holds task i mod 2,
    so an even num_clients gives each task equal shares), both every round, partition iid;
    LeNet5 is "lenet-cifar" (LeNet-5 on 32x32 inputs, the official code's LeNet5 in Model.py),
    CNN1 the McMahan CNN "cnn" (as in fml-paper); the shared model CNN1 too (not given).
    Everything else as fml-paper (official code: lr 0.01, momentum 0.9, weight decay 5e-4,
    batch 128, 5 local epochs, a = b = 0.5, 10% held out per client).
    """
    return dict(fml_paper(), dataset="cifar10+cifar100", model="cnn",
                personal_models="lenet-cifar,cnn", partition="iid", num_clients=2,
                clients_per_round=2, rounds=250)


@preset("fedup-paper")
def fedup_paper() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Table 4, CIFAR-10 with ResNet18-GN (Section 6.1).

    From the paper: 100 clients, 10% sampled per round, SGD with lr eta = 0.2, batch size 32,
    T = 1500 rounds, 1 local epoch (6.1.3); ResNet18 with group normalisation after FedDyn
    (6.1.2); Dirichlet q in {0.3, 0.4, 0.6} or IID (Table 4). Not in the paper, chosen here:
    q = 0.3 (the first and most skewed CIFAR-10 column); momentum 0 and no weight decay (the
    paper says only "SGD"); FedUp's alpha is not reported: chosen here as about 1/K for
    K local steps, where Theorem 1's error term (alpha*K - 1)^2 vanishes; 500 samples per
    client / batch 32 is about 16 steps, so alpha = 0.05. Every method of the table
    aggregates with the uniform mean, which is how the paper writes FedAvg (eq. 3) and FedUp
    (Alg. 1 l.9).

    The table's other methods run on these settings (``--algorithm NAME`` with this preset;
    sweeps/fedup_table4.yaml and fedup_table5.yaml do) with values FedUp does not report,
    taken from each method's paper or authors' code (each module says where): FedProx mu
    0.01; SCAFFOLD option II, eta_g 1; FedDyn alpha 0.01; MOON mu 1 (5 on CIFAR-10), tau 0.5,
    projection 256; MimeLite beta 0.9; STEM a 0.1 (ours); FedSMOO alpha = rho = 0.1; FedPVR
    the classifier head. This preset's momentum 0 is what MimeLite and STEM require.
    """
    return dict(algorithm="fedup", dataset="cifar10", model="resnet18-gn",
                partition="dirichlet", dirichlet_alpha=0.3, num_clients=100,
                clients_per_round=10, rounds=1500, local_epochs=1, batch_size=32, lr=0.2,
                momentum=0.0, weight_decay=0.0, fedup_alpha=0.05, weighting="uniform")


@preset("fedup-paper-cifar100")
def fedup_paper_cifar100() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Table 4, CIFAR-100 with ResNet18-GN.

    From 6.1.3: 100 clients, 10% sampling, lr 0.2, batch size 16, T = 1000, 1 local epoch.
    Table 4's CIFAR-100 q values are 0.02, 0.1, 0.3, 0.4, 0.6 and IID; q = 0.3 chosen (shared
    with the CIFAR-10 columns); alpha = 0.03 (about 1/K for ~32 local steps at batch 16,
    chosen here as in fedup-paper). Other choices as fedup-paper.
    """
    return dict(fedup_paper(), dataset="cifar100", batch_size=16, rounds=1000, fedup_alpha=0.03)


@preset("fedup-paper-femnist")
def fedup_paper_femnist() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Table 4, FEMNIST with its CNN (LEAF's natural split).

    From 6.1.2-6.1.3: 3400 clients, 10% sampling (340 per round), lr 0.02, batch size 20,
    T = 1000, 1 local epoch; a CNN with 5x5 convs of 10 and 20 filters and a 320-unit
    layer ("femnist-cnn"). The natural per-writer split is our reading of "non-IID" with a
    LEAF citation. Momentum 0 as in fedup-paper; alpha = 0.08 chosen here (about 1/K for
    ~12 local steps of batch 20 on a writer's ~230 samples).
    """
    return dict(fedup_paper(), dataset="femnist", model="femnist-cnn", partition="natural",
                num_clients=3400, clients_per_round=340, lr=0.02, batch_size=20, rounds=1000,
                fedup_alpha=0.08)


@preset("fedup-paper-femnist-500")
def fedup_paper_femnist_500() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Fig. 2: FEMNIST with 500 of the 3400 clients per round.

    Section 6.3 samples "large-scale" participation, 500 and 1020 clients per round
    (fedup-paper-femnist-1020), to test that FedUp scales. Everything else:
    fedup-paper-femnist.
    """
    return dict(fedup_paper_femnist(), clients_per_round=500)


@preset("fedup-paper-femnist-1020")
def fedup_paper_femnist_1020() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Fig. 2: FEMNIST with 1020 of the 3400 clients per round.

    As fedup-paper-femnist-500 with 1020 clients per round (30%).
    """
    return dict(fedup_paper_femnist(), clients_per_round=1020)


@preset("fedup-paper-shakespeare", inputs=None)
def fedup_paper_shakespeare() -> dict[str, Any]:
    """FedUp (Sci Sin Inform 2024) Fig. 3: next-character prediction on Shakespeare.

    From Section 6.4: each speaking role is a client (the natural split); "following [7]"
    (FedProx), a two-layer LSTM with 100 hidden units, an 8-dimensional embedding and 80
    classes ("lstm-100"); FedUp against FedAvg. The section gives no other value. Chosen
    here, from FedUp's other settings: SGD without momentum, 1 local epoch, 10% of the
    clients per round, uniform aggregation. From FedProx's Shakespeare setting as we read it
    (not restated by FedUp; check against FedProx's appendix before quoting): lr 0.8,
    batch size 10, 143 roles, 40 rounds. FedUp's alpha 0.05 as on CIFAR-10 (not reported).
    The play texts or LEAF's JSON are read by the shakespeare loader (max_roles 143).
    """
    return dict(fedup_paper(), dataset="shakespeare", model="lstm-100", partition="natural",
                num_clients=143, clients_per_round=14, rounds=40, lr=0.8, batch_size=10,
                data_options={"max_roles": 143})


@preset("fedswa-paper", inputs="the official code standardises with (0.4914, 0.4822, "
                               "0.4465) / (0.2023, 0.1994, 0.2010), close to those")
def fedswa_paper() -> dict[str, Any]:
    """FedSWA (Liu et al., ICML 2025) Table 2: CIFAR-10, ResNet-18, Dirichlet 0.6.

    From the paper (as read; flnotes/algorithms/fedswa.py says how): 100 clients with 10%
    sampled per round, Dirichlet 0.6 (Table 2's column; Table 3 adds 0.1 and 0.3), ResNet-18
    with BatchNorm (the official code's --normalization BN), the local rate falling from lr
    to rho * lr with rho = 0.1 and the server step alpha = 1.5 (its ablations' best values).
    From the official code (github.com/junkangLiu0/FedSWA, main_FedSWA.py and the README's
    commands) where our reading of the paper gives no value: 5 local epochs of batch 50
    (500 samples a client, so K = 50 steps, the code's --K 50), SGD without momentum,
    weight decay 1e-3, 301 rounds (--epoch 301, counted from 0), lr 0.1 (the README's
    FedAvg and MoFedSWA rate). Not taken from the code: its FedSWA command's --lr 0.2, which
    update_FedSWA doubles again (peak 0.4, falling to 0 as rho = 0 there), its cosine decay
    of lr over the rounds, its gradient clipping at norm 10 and its random crop and flip
    (flnotes has none of these). Aggregation: FedSWA's uniform mean (its default weighting).
    """
    return dict(algorithm="fedswa", dataset="cifar10", model="resnet18",
                partition="dirichlet", dirichlet_alpha=0.6, num_clients=100,
                clients_per_round=10, rounds=301, local_epochs=5, batch_size=50, lr=0.1,
                momentum=0.0, weight_decay=1e-3, fedswa_rho=0.1, fedswa_alpha=1.5)


@preset("fedlesam-paper", inputs="as the code's Normalize(mean=[0.491, 0.482, 0.447], "
                                 "std=[0.247, 0.243, 0.262]) does (dataset.py)")
def fedlesam_paper() -> dict[str, Any]:
    """FedLESAM (Fan et al., ICML 2024) on CIFAR-10 with a GroupNorm ResNet-18.

    The paper's experimental section was not available to us when this was written; every
    value below is the authors' (github.com/MediaBrain-SJTU/FedLESAM, d6663cc), which ran the
    paper: its README's CIFAR-10 command (Dirichlet split 0.6, 100 clients, active ratio 0.1
    so 10 a round, batch size 50, 5 local epochs, 800 rounds, ResNet18) and train.py's
    defaults (local lr 0.1, weight decay 1e-3, global lr 1, rho 0.1; the README's command
    shows rho 0.5 for the FedLESAM-S variant, not this method). Check them against the
    paper's setup section before quoting. The code's ResNet18 is torchvision's with
    GroupNorm(2, C) for every BatchNorm (models.py): resnet18-gn here (flnotes keeps the
    CIFAR stem, see flnotes.models). The server averages the round's updates uniformly
    (server.py: torch.mean over the selected clients): weighting="uniform". SGD without
    momentum (client/fedlesam.py). Not reproduced: the code's per-round learning-rate decay
    0.998 and its gradient clipping at norm 10 (flnotes has neither); its client sampling
    (each client active with probability 0.1, so a varying number a round) is replaced by
    10 clients drawn a round.
    """
    return dict(algorithm="fedlesam", dataset="cifar10", model="resnet18-gn",
                partition="dirichlet", dirichlet_alpha=0.6, num_clients=100,
                clients_per_round=10, rounds=800, local_epochs=5, batch_size=50, lr=0.1,
                momentum=0.0, weight_decay=1e-3, weighting="uniform", lesam_rho=0.1)


@preset("fedmoswa-paper", inputs='as fedswa-paper')
def fedmoswa_paper() -> dict[str, Any]:
    """FedMoSWA (Liu et al., ICML 2025) Table 2: CIFAR-10, ResNet-18, Dirichlet 0.6.

    The paper's setting as fedswa-paper (100 clients, 10% a round, Dirichlet 0.6, ResNet-18,
    rho = 0.1, alpha = 1.5; 5 local epochs of batch 50, SGD without momentum, weight decay
    1e-3, 301 rounds and lr 0.1 from the official code's README, where its MoFedSWA command
    uses --lr 0.1) with the server variate's momentum gamma = 0.2 (the paper's ablation's
    best). Not taken from the code: its MoFedSWA runs SCAFFOLD's update at a constant rate
    (no cyclical schedule) with gamma hard-coded 0.4 after a first round at gamma 1, and
    alpha 1 (flnotes/algorithms/fedswa.py lists the differences); nor its cosine decay of lr
    over the rounds, gradient clipping and random crop and flip.
    """
    return dict(fedswa_paper(), algorithm="fedmoswa", moswa_gamma=0.2)


@preset("fedgloss-paper", inputs="as the code's Normalize((0.4914, 0.4822, 0.4465), "
                                 "(0.2470, 0.2434, 0.2616)) does (codebase/clients/client.py)")
def fedgloss_paper() -> dict[str, Any]:
    """FedGloSS (Caldarola et al., CVPR 2025) on CIFAR-10: the authors' CIFAR-10 runs.

    The paper's text was not available to us when this was written; every value is from the
    script the authors ship for the paper's CIFAR-10 experiments
    (github.com/pietrocagnasso/fedgloss, cbd6cf5, paper_experiments/cnn_cifar10.sh) and its
    README: 100 clients (the README: CIFAR-10 split equally among 100 clients), 5 a round
    (--C-t 5), T = 10000 rounds, 1 local epoch, batch size 64, SGD with lr 0.01, momentum 0,
    weight decay 4e-4, server SGD with rate 1 (flnotes' only server step), rho = rho_l =
    0.15, beta = 10, a 2000-round rho warm-up from rho0 = 0.001 (the code's default). Check
    them against the paper's setup section before quoting. Chosen here: the Dirichlet
    split alpha = 0.05 (the scripts run alpha in {0, 0.05, 1, 5, 10, 100}; 0.05 is the
    README's figure's, and flnotes' Dirichlet partition needs alpha > 0; its client sizes are
    not forced equal as the authors' JSON splits are); the model "cnn" (McMahan et al.'s two
    5x5 convolutions with max-pooling and a 512-unit layer) stands in for the authors' CNN
    (two 64-channel 5x5 convolutions, layers of 384 and 192 units; codebase/cifar10/cnn.py),
    which flnotes' model registry does not have. Not reproduced: the code's random crop and
    horizontal flip of training images.
    """
    return dict(algorithm="fedgloss", dataset="cifar10", model="cnn", partition="dirichlet",
                dirichlet_alpha=0.05, num_clients=100, clients_per_round=5, rounds=10000,
                local_epochs=1, batch_size=64, lr=0.01, momentum=0.0, weight_decay=4e-4,
                weighting="samples", gloss_rho=0.15, gloss_rho_local=0.15, gloss_beta=10.0,
                gloss_warmup=2000, gloss_rho0=0.001)


@preset("fedcross-paper")
def fedcross_paper() -> dict[str, Any]:
    """FedCross (Hu et al., ICDE 2024) on CIFAR-10 with the CNN, lowest-similarity selection.

    The paper's experimental section was not available to us when this was written (only its
    abstract came back from the stored pages); the values are the ones its authors' group
    uses on this testbed (flnotes/algorithms/fedcross.py says how the method was read).
    From the FedCross code of the authors' lab (github.com/mastlab-T3S/Federated_Learning,
    65b8916, utils/options.py and Algorithm/Training_FedCross.py): alpha = 0.99 (the value
    the paper's experiments use, as recalled), lowest-similarity selection (the code's
    default strategy 1), cross-aggregation from round 1 (first-stage bound 0), 100 clients
    with 10% a round, 5 local epochs of batch 50, SGD lr 0.01 with momentum 0.5 and no
    weight decay (its FedCross client builds SGD from lr and momentum alone), 1000 rounds
    (--epochs), the mean of the models uniform. Chosen here: the McMahan CNN and Dirichlet
    0.5 (as fedmr-paper, the same group's testbed; the code defaults to a ResNet and
    Dirichlet 0.1: override model and dirichlet_alpha). Check them against the paper's
    setup section before quoting.
    """
    return dict(_mutation_setup(), algorithm="fedcross", momentum=0.5, weight_decay=0.0,
                rounds=1000, weighting="uniform", cross_alpha=0.99,
                cross_selection="lowest-similarity")


@preset("fedgf-paper")
def fedgf_paper() -> dict[str, Any]:
    """FedGF (Lee and Yoon, ICML 2024) on CIFAR-10: the authors' example script's setting.

    The paper's text was not available to us when this was written; the values are from the
    authors' code (github.com/hwan-sig/Official-FedGF, 36233b7, tools/experiments/cifar.sh
    and tools/Lib/arg_parser.py): 100 clients, a sampling ratio of 0.1 (the script runs
    0.05, 0.1 and 0.2), 1 local epoch of batch 64, SGD lr 0.01 with weight decay 4e-4 and no
    momentum (the parser's default 0), 10000 rounds, rho 0.1 (the script's grid {0.02,
    0.05, 0.1}), rho_g = rho, W = 30, c 0.3 (the script's --c_o, read as a fixed c:
    flnotes/algorithms/fedgf.py says why). Chosen here: Dirichlet 0.05 (the script's
    heterogeneous CIFAR-10 split; it also runs 0 and 100), and the model "cnn" (McMahan et
    al.'s CNN) for the code's FedSAMcnn (two 64-channel 5x5 convolutions, layers of 384 and
    192 units), which flnotes' model registry does not have. Not reproduced: the code's
    random crop and flip. Check the values against the paper's setup before quoting.
    """
    return dict(algorithm="fedgf", dataset="cifar10", model="cnn", partition="dirichlet",
                dirichlet_alpha=0.05, num_clients=100, clients_per_round=10, rounds=10000,
                local_epochs=1, batch_size=64, lr=0.01, momentum=0.0, weight_decay=4e-4,
                weighting="samples", gf_rho=0.1, gf_c=0.3, gf_window=30)


@preset("fedgmt-paper")
def fedgmt_paper() -> dict[str, Any]:
    """FedGMT (Li et al., ICML 2025) on CIFAR-10 with the CNN: the authors' README command.

    The paper's text was not available to us when this was written; the values are from the
    authors' code (github.com/harrylee999/FL-SAM, 2c16149: the README's FedGMT command and
    its "common training hyperparameters", system/main.py): 100 clients with 10% a round,
    5 local epochs of batch 50, SGD lr 0.01 with momentum 0.9 and weight decay 1e-5, 500
    rounds, gamma 1, alpha 0.95, tau 3, beta 10; the model is FedAvgNetCIFAR, McMahan et
    al.'s CNN ("cnn"); the mean of the local models by client size. Chosen here: Dirichlet
    0.1 (the README's table runs IID and Dirichlet 1.0, 0.1 and 0.01). Not reproduced: the
    code's learning-rate decay by 0.998 a round and its random crop and flip (flnotes has
    neither). Check the values against the paper's setup before quoting.
    """
    return dict(algorithm="fedgmt", dataset="cifar10", model="cnn", partition="dirichlet",
                dirichlet_alpha=0.1, num_clients=100, clients_per_round=10, rounds=500,
                local_epochs=5, batch_size=50, lr=0.01, momentum=0.9, weight_decay=1e-5,
                weighting="samples", gmt_alpha=0.95, gmt_gamma=1.0, gmt_tau=3.0,
                gmt_beta=10.0)
