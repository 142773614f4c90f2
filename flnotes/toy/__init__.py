"""The 2-D toy: analytic client landscapes (``landscapes``), the toy federation as a Task that
every algorithm runs on unchanged (``task``), runs and races of methods (``experiments``),
their pictures (``plots``) and the notebooks' explorers (``widgets``).

``from flnotes import toy`` gives the functions the notebooks call: ``toy.run_toy``,
``toy.race``, ``toy.mutation_points``, ...
"""

from flnotes.toy.experiments import (
    FINAL_KEYS,
    TEACHING,
    final_metrics,
    final_table,
    forget_races,
    kept_race,
    mutation_points,
    mutation_region,
    mutation_regions,
    mutation_round,
    race,
    race_table,
    run_toy,
    toy_config,
    trajectory_points,
)
from flnotes.toy.task import DEFAULT_START, ToyModel, ToyTask, build_task, point_of, state_of

__all__ = ["DEFAULT_START", "FINAL_KEYS", "TEACHING", "ToyModel", "ToyTask", "build_task",
           "final_metrics", "final_table", "forget_races", "kept_race", "mutation_points",
           "mutation_region", "mutation_regions", "mutation_round", "point_of",
           "race", "race_table", "run_toy", "state_of", "toy_config", "trajectory_points"]
