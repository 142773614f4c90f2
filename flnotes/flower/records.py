"""What crosses Flower's wire and what both apps build alike: records, config, task.

Both apps build the same :class:`~flnotes.config.RunConfig` (from Flower's run config, the
``[tool.flwr.app.config]`` table, or given in Python) and from it the same task, with
:func:`flower_task`; the server sends its settings hash with every message so that a node
built from other settings says so instead of training something else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import OrderedDict
from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord

from flnotes.algorithms import algorithm_class, algorithm_names
from flnotes.config import RunConfig
from flnotes.engine.tasks import build_task


def supported() -> list[str]:
    """Methods whose round splits into server (dispatch, aggregate) and client (local
    training from the start state and the config alone, or with a server-sent anchor): those
    whose clients keep no state the server reads back (``Strategy.runs_on_flower``)."""
    return [n for n in algorithm_names() if algorithm_class(n).runs_on_flower]


SUPPORTED = tuple(supported())  # the built-in ones, derived when flnotes.flower is imported

DTYPES = {"float32": torch.float32, "float64": torch.float64}

# Keys of Flower's run config that are the apps' own, not RunConfig fields.
APP_KEYS = ("dtype", "timeout")


def check_supported(algorithm: str) -> None:
    """ValueError (one line) for a method not offered on Flower."""
    offered = supported()
    if algorithm in offered:
        return
    choose = f"on Flower choose one of {', '.join(offered)}"
    if algorithm in algorithm_names():
        raise ValueError(f"algorithm {algorithm!r} is not offered on Flower: its clients keep "
                         f"state the server reads back (see flnotes.flower); {choose}")
    raise ValueError(f"unknown algorithm {algorithm!r}; {choose}")


def check_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a ``dtype`` setting ('float32' or 'float64')."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not offered; choose float32 (as flnotes.run) "
                         "or float64")
    return DTYPES[dtype]


def check_timeout(timeout) -> float:
    """``timeout`` as seconds: a positive finite number (Flower would wait forever on a
    negative or NaN one, or give up at once at 0), else a one-line ValueError."""
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(timeout, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"timeout {timeout!r} is not a number of seconds; give a positive "
                         "number (how long to wait for nodes and replies)")
    return seconds


def config_from_run_config(values: Mapping) -> tuple[RunConfig, dict]:
    """(RunConfig, app settings) from Flower's run config.

    Keys are RunConfig fields, with ``-`` or ``_`` (Flower's convention is ``num-clients``);
    a dict field (``data-options``) is a JSON string, since Flower's values are scalars.
    ``dtype`` and ``timeout`` are the apps' own. A field left out takes RunConfig's default.
    """
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}  # dict-valued: data_options
    config, app = {}, {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in fields and fields[name].default_factory is dict and isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(f"run config {key} = {value!r} is not a JSON object "
                                 f"({err.msg})") from None
        (app if name in APP_KEYS else config)[name] = value
    # An app's config is a template for several methods (stage1-rounds for FedMR beside
    # algorithm = "fedmut"), as a preset is: settings the method does not read are not used.
    run_config = RunConfig.from_dict(config)
    check_supported(run_config.algorithm)
    check_dtype(app.get("dtype", "float32"))
    if "timeout" in app:
        app["timeout"] = check_timeout(app["timeout"])
    return run_config, app


def flower_task(config: RunConfig, dtype: str = "float32"):
    """The engine's task for ``config``; with ``dtype='float64'`` its float inputs and its
    models in float64 (the engine builds float32 data; a float64 comparison with
    ``flnotes.run`` passes this same task to it: ``flnotes.run(config, task=...)``)."""
    task = build_task(config.resolved())
    want = check_dtype(dtype)
    if want == torch.float32:
        return task
    factory = task.model_factory
    cast = lambda t: t.to(want) if t.is_floating_point() else t  # noqa: E731 - token ids stay
    return dataclasses.replace(task, model_factory=lambda: factory().to(want),
                               train_x=cast(task.train_x), test_x=cast(task.test_x))


def state_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord of a state (names and order kept; tensors copied to the CPU)."""
    return ArrayRecord(OrderedDict((n, t.detach().cpu()) for n, t in state.items()))


def record_state(record: ArrayRecord, device: torch.device | str = "cpu"
                 ) -> OrderedDict[str, torch.Tensor]:
    """The state an ArrayRecord holds, on ``device``."""
    return OrderedDict((n, t.to(device)) for n, t in record.to_torch_state_dict().items())
