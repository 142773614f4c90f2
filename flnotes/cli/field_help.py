"""One line of help per RunConfig field: the command line's ``run --help``.

Each says what the field does; the command line adds choices and defaults. A test checks
that every field has one.
"""

# One line of help per field (the command line's --help; widgets may show them too). Each
# says what the field does; choices and defaults are added by the command line.
FIELD_HELP = {
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
    "momentum": "client SGD momentum, in [0, 1)",
    "weight_decay": "client SGD weight decay (L2)",
    "weighting": "how the server averages client models: by sample count or uniformly "
                 "(default: the algorithm's)",
    "mu": "FedProx proximal weight",
    "alpha": "depends on the algorithm: FedMut/FedQP mutation range, FedUp penalty weight "
             "(default: the algorithm's, 4.0 for fedmut, 0.01 for fedup)",
    "beta0": "FedMut/FedQP initial preference beta, in [0, 1]",
    "beta_rounds": "FedMut T_b: rounds over which beta decays to 0",
    "qp_prob": "FedQP: probability of projecting a layer, in [0, 1]",
    "mutation": "FedQP mutation: sign (FedMut's) or gaussian",
    "stage1_rounds": "FedMR: rounds of plain FedAvg before recombination starts",
    "segments": "FedMR-p: segments recombined as units (0: every layer is a segment)",
    "secure_exchanges": "FedMR: secure layer exchanges among the round's clients before "
                        "upload (App. B), so the server cannot tell whose layers it holds; 0: off",
    "personal_weight": "FML a: cross-entropy weight in the personal model's loss, in [0, 1]",
    "meme_weight": "FML b: cross-entropy weight in the meme model's loss, in [0, 1]",
    "personal_models": "FML: the personal models' architecture, one name or a comma-separated "
                       "list (client i takes entry i mod n); default: the shared model's",
    # -- mutation-family baselines (issue 17)
    "fedexp_eps": "FedExP: eps in the server step size max(1, sum p_i|D_i|^2 / 2(|D|^2 + eps))",
    "fedexp_average": "FedExP: evaluate and return the mean of the last two server iterates",
    "sam_rho": "FedSAM/FedASAM: ascent radius rho (default: 0.05 FedSAM, 0.5 FedASAM)",
    "fedgen_alpha": "FedGen: weight of the cross-entropy on generated features (0: off)",
    "fedgen_beta": "FedGen: weight of the KL to the head's output on generated features (0: off)",
    "fedgen_lr": "FedGen: Adam learning rate of the server's feature generator",
    "fedgen_steps": "FedGen: generator training steps on the server per round",
    "fedgen_batch": "FedGen: generated samples per local step",
    "swa": "FedSAM/FedASAM: server-side stochastic weight averaging in the last rounds",
    "swa_start": "SWA: first round of the averaging phase (default: after 3/4 of the rounds)",
    "swa_cycle": "SWA: rounds per learning-rate cycle; one model averaged per cycle",
    "swa_lr": "SWA: the cycle's lowest learning rate (it falls from lr to this)",
    "asam_eta": "FedASAM: eta in the adaptive scale T_w = |w| + eta",
    "ntd_beta": "FedNTD: weight of the not-true distillation loss (0: FedAvg)",
    "ntd_tau": "FedNTD: softmax temperature of the not-true distillation",
    "clusamp_distance": "CluSamp: distance between clients' last updates (cosine: their angle; "
                        "l1; l2: squared)",
    "clusamp_sketch": "CluSamp: keep a k-number count sketch of each client's update instead "
                      "of the whole update (0: whole, the paper; saves memory on large models)",
    # -- FedUp-table baselines (issue 12)
    "server_lr": "SCAFFOLD: server step size eta_g on the mean client update (1: FedAvg's "
                 "mean)",
    "feddyn_alpha": "FedDyn: weight alpha of the dynamic regulariser (0: clients train as "
                    "FedAvg, the server still adds the mean drift)",
    "moon_mu": "MOON: weight mu of the model-contrastive loss (default: 5 on cifar10, 1 "
               "elsewhere, as its paper)",
    "moon_tau": "MOON: temperature tau of the model-contrastive loss",
    "smoo_alpha": "FedSMOO: weight alpha of its FedDyn-style dynamic regulariser",
    "smoo_rho": "FedSMOO: SAM radius rho of the globally steered perturbation (0: FedDyn)",
    "mime_beta": "MimeLite: momentum beta of the server state the clients step with",
    "stem_a": "STEM: momentum parameter a in (0, 1] of d = g(x) + (1 - a)(d - g(x_prev))",
    "pvr_layers": "FedPVR: layers with SCAFFOLD's variance reduction, counted from the output "
                  "(1: the classifier head; 0: FedAvg; all: SCAFFOLD)",
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
