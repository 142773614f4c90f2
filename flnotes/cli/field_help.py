"""One line of help per common RunConfig field: the command line's ``run --help``.

Each says what the field does; the command line adds choices and defaults. A method's own
settings carry their help in their declarations (flnotes.algorithms.settings);
:data:`FIELD_HELP` reads both. A test checks that every field has one.
"""

from collections.abc import Iterator, Mapping

from flnotes.algorithms import all_settings

# (Widgets may show these too, besides the command line's --help.)
COMMON_HELP = {
    "algorithm": "federated algorithm to run",
    "dataset": "dataset to train on (toy: the 2-parameter teaching landscape)",
    "model": "model architecture (default: the dataset's usual model, e.g. cnn for cifar10)",
    "data_dir": "folder holding the dataset files (default: $FLNOTES_DATA or "
                "~/.cache/flnotes/data)",
    "download": "true/false: fetch the dataset into data_dir if it is missing (torchvision "
                "datasets only)",
    "data_options": "dataset loader option KEY=VALUE, repeatable (e.g. num_train=1000, "
                    "coarse=true, max_roles=20); a wrong key lists the dataset's options",
    "partition": "how training data are split over clients (natural: the dataset's own "
                 "split, LEAF only)",
    "dirichlet_alpha": "Dirichlet concentration of the label skew (partition dirichlet; "
                       "smaller is more skewed)",
    "shards_per_client": "label-sorted shards each client gets (partition shards)",
    "min_client_size": "least samples a client may get; the split is redrawn until all do",
    "partition_manifest": "JSON file to load the exact client split from, or to save it to",
    "client_test_fraction": "share of each client's data held out to test its own model "
                            "(default: the algorithm's, 0.1 for fml, else 0)",
    "num_clients": "number of clients in the federation",
    "clients_per_round": "clients sampled (without replacement) each round",
    "rounds": "communication rounds; a larger value on a completed run folder continues it",
    "local_epochs": "epochs each sampled client trains per round",
    "batch_size": "client mini-batch size",
    "lr": "client SGD learning rate",
    "momentum": "client SGD momentum, in [0, 1) (default: 0.9; 0 for mimelite and stem, "
                "which bring their own)",
    "weight_decay": "client SGD weight decay (L2)",
    "weighting": "how the server averages client models: by sample count or uniformly "
                 "(default: the algorithm's)",
    "seed": "seed of every random draw (split, sampling, initial model, batches)",
    "eval_every": "evaluate the global model every this many rounds (and at the last)",
    "eval_batch_size": "batch size of evaluation (memory only; results do not change)",
    "checkpoint_every": "save a resumable checkpoint every this many rounds",
    "device": "auto (cuda if available, else cpu), cpu, cuda or cuda:N",
    "backend": "client training: loop (one client at a time), vmap (clients as one "
               "stack) or auto (vmap on a GPU, loop on a CPU)",
    "compile": "torch.compile the vmap backend's training step in this mode (costs 20 s "
               "to minutes of compilation once per run)",
    "record_states": "true/false: keep every dispatched, local and global state (toy "
                     "models only: memory grows with rounds)",
    "run_dir": "run folder for config, metrics and checkpoints; the same command on it "
               "resumes (command line default: runs/<algorithm>-<dataset>-<partition>-"
               "seed<N>-<hash of the settings>)",
}


class _FieldHelp(Mapping):
    """Help of every field: the common ones above, each method setting's own declaration."""

    def __getitem__(self, name: str) -> str:
        if name in COMMON_HELP:
            return COMMON_HELP[name]
        return next(iter(all_settings()[name].values())).help  # (KeyError: no such field)

    def __iter__(self) -> Iterator[str]:
        yield from COMMON_HELP
        yield from (n for n in all_settings() if n not in COMMON_HELP)

    def __len__(self) -> int:
        return len(list(iter(self)))


FIELD_HELP = _FieldHelp()
