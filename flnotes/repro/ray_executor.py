"""Sweep cells as Ray tasks: ``python -m flnotes sweep GRID --executor ray [--address ADDR]``.

One Ray task per cell, each running :func:`flnotes.repro.sweep.run_cell` (papermill, the
same code as the local executor), so a cell's folder, ``cell.json`` and the sweep's
``summary.csv`` are the same whichever executor ran it. Without ``--address`` a local Ray
instance starts with ``--workers`` CPUs (so at most that many cells run at once) and stops
at the end; with one, the sweep joins a running cluster (``ray start --head`` on one machine,
``ray start --address HEAD:6379`` on the others) and the cluster's resources decide.

Every node writes into the sweep's output folder, so the folder (and the repository, whose
notebook the cells run) must be on a file system every node sees at the same path.

A cell asks for one GPU where the cluster has GPUs (Ray then sets CUDA_VISIBLE_DEVICES for
it) and one CPU otherwise. A cell that fails is recorded and the others go on, as locally.
Ctrl-C cancels the cells still running (their folders say ``running`` and resume on the
next run) and keeps what finished.
"""

from __future__ import annotations

from collections.abc import Callable

INSTALL_HINT = "--executor ray needs Ray: pip install 'flnotes[ray]'"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


def run_on_ray(run_cell: Callable[..., dict], jobs: list, workers: int, address: str | None,
               on_record: Callable[[dict], None],
               failed_record: Callable[[tuple, str], dict]) -> None:
    """Run ``run_cell(*job)`` for every job as a Ray task (the sweep's own cell function, so
    a cell runs exactly as locally); hand each finished record to ``on_record``."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(num_cpus=workers, num_gpus=0, **options)
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        task = ray.remote(num_cpus=0 if gpus else 1, num_gpus=1 if gpus else 0,
                          max_retries=0)(run_cell)
        pending = {task.remote(*job): job for job in jobs}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        record = ray.get(ref)
                    except Exception as err:  # the task itself died (not a failed notebook)
                        record = failed_record(job, f"{type(err).__name__}: {err}")
                    on_record(record)
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started_here:
            ray.shutdown()
