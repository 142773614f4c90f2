"""flnotes: learn and reproduce federated learning methods that seek flat minima.

What a user's script needs: a :class:`RunConfig` (or a preset,
``RunConfig.from_preset(name)``), :func:`run` (or :func:`run_seeds`), and the
:class:`History` they return; :func:`build_task` and :func:`build_strategy` for the pieces of
a run; the registries of methods, datasets, models and presets; :func:`register_algorithm`
and :class:`Setting` to add a method of your own (CONTRIBUTING.md).
"""

from flnotes.algorithms import (
    Setting,
    Strategy,
    algorithm_names,
    build_strategy,
    register_algorithm,
    settings_of,
)
from flnotes.config import RunConfig
from flnotes.config.presets import preset_names
from flnotes.data.registry import dataset_names
from flnotes.engine.history import History
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import run
from flnotes.engine.tasks import build_task
from flnotes.models import model_names
from flnotes.toy import task as _toy_task  # noqa: F401  (registers the "toy" dataset)

__version__ = "0.2.0"
__all__ = ["History", "RunConfig", "Setting", "Strategy", "algorithm_names", "build_strategy",
           "build_task", "dataset_names", "model_names", "preset_names", "register_algorithm",
           "run", "run_seeds", "settings_of", "__version__"]
