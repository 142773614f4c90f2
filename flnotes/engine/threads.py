"""How many CPU threads a run's torch uses: never more than help.

torch's default is one intra-op thread per core, which pays only when the cores are idle
and each operation is large enough. Measured on this project's 2-core machine
(``python benchmarks/threads.py``, benchmarks/README.md): with other processes busy on the
cores (load average 5-6), a local step at two threads took 1.8x (ResNet-18) to 67x (the
MLP) one thread's wall time, 5x for the seed code's LeNet; with the cores idle, two threads
took 0.56-0.74x one thread's for every model from the seed code's LeNet (0.65M multiply-adds
per sample) up to ResNet-18, and 1.14x for the MLP (0.2M). So:

- a count the user gives (``run --threads N``, ``run(config, threads=N)``) is used as given;
- a count the environment gives (``OMP_NUM_THREADS``, as ``sweep`` and ``make test`` set
  it) is kept: whoever set it chose;
- otherwise one thread, unless the model has at least ``LARGE_MACS`` multiply-adds per sample
  (LeNet, the McMahan CNN, ResNet-20, the LSTM, ResNet-18 and VGG-16 do; the MNIST MLP does
  not) and cores are idle: then the idle cores (cores this process may use minus the load
  average others put on them, rounded), at most ``MOST_THREADS``. A GPU run keeps one
  CPU thread (the CPU only feeds the GPU).

How it generalises: the crossover is the size at which one operation's work outweighs
handing it to a second thread, a property of the model and the core, not of their number;
more idle cores gain less per core (run ``benchmarks/threads.py --threads 1,2,4`` there),
and ``run --client-workers N`` (clients in N processes, 0.54x at N = 2 for LeNet) beats
threads for the small models.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import torch
from torch import nn

LARGE_MACS = 0.5e6  # multiply-adds per sample: the MLP 0.2M, LeNet 0.65M, ResNet-18 ~560M
MOST_THREADS = 8
MOST_REQUESTED = 1024  # the most a user may ask for: far beyond any CPU's cores


def multiply_adds(model: nn.Module, example: torch.Tensor) -> float:
    """Multiply-adds of one forward pass per sample (convolutions, linear layers, LSTMs),
    counted by forward hooks on one example batch."""
    total = 0.0

    def conv(module, inputs, output):
        nonlocal total
        per_output = module.in_channels // module.groups * \
            float(torch.tensor(module.kernel_size).prod())
        total += per_output * output[0].numel()

    def linear(module, inputs, output):
        nonlocal total
        total += module.in_features * module.out_features * \
            (output[0].numel() // module.out_features)

    def lstm(module, inputs, output):
        nonlocal total
        steps = output[0].shape[1] if module.batch_first else output[0].shape[0]
        gates = 4 * module.hidden_size
        total += steps * module.num_layers * gates * (module.input_size + module.hidden_size)

    kinds: dict[type, Callable] = {nn.Conv2d: conv, nn.Conv1d: conv, nn.Linear: linear,
                                   nn.LSTM: lstm}
    handles = [m.register_forward_hook(hook) for m in model.modules()
               for kind, hook in kinds.items() if isinstance(m, kind)]
    try:
        with torch.no_grad():
            model(example[:1])
    finally:
        for handle in handles:
            handle.remove()
    return total


def idle_cores() -> int:
    """Cores this process may use that others leave idle (at least 1): the usable cores
    minus the load average, rounded (a load of 0.3 on 2 cores leaves both idle; truncating
    gave one thread there, where two took 0.47-0.67 of its wall time)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, round(usable - busy))


def default_threads(macs: float, on_gpu: bool = False) -> int:
    """The rule above for a model of ``macs`` multiply-adds per sample."""
    if on_gpu or macs < LARGE_MACS:
        return 1
    return min(MOST_THREADS, idle_cores())


def choose_threads(requested: int | None, macs: Callable[[], float],
                   on_gpu: bool = False) -> int | None:
    """The thread count to set, or None to keep torch's (the environment chose it)."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"threads={requested!r} is invalid: give a whole number >= 1 "
                             "(or leave it out: flnotes picks one, see flnotes/engine/threads.py)")
        if requested > MOST_REQUESTED:  # torch's pool crashes (SIGSEGV) at tens of thousands
            raise ValueError(f"threads={requested} is invalid: at most {MOST_REQUESTED} (this "
                             f"machine has {os.cpu_count()} cores; threads beyond them only wait)")
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return 1 if on_gpu else default_threads(macs())


def task_multiply_adds(task) -> float:
    """Multiply-adds per sample of a task's model on one of its training inputs (0 where
    the task has no such input, as the toy's two numbers)."""
    if getattr(task, "train_x", None) is None or len(task.train_x) == 0:
        return 0.0
    return multiply_adds(task.model_factory(), task.train_x[:1])


@contextlib.contextmanager
def threads_for(task, requested: int | None, on_gpu: bool):
    """Run the block at the thread count of the rule above; torch's count is restored after
    (the caller's process keeps its own setting). Off the main thread (the toy explorers
    race in a worker thread, and a stopped worker may still run beside the next one) the
    process-wide count is left alone: two overlapping runs would restore each other's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chosen = choose_threads(requested, lambda: task_multiply_adds(task), on_gpu)
    before = torch.get_num_threads()
    if chosen is not None and chosen != before:
        torch.set_num_threads(chosen)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
