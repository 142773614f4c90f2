"""What a run is: :class:`RunConfig` (every setting, validated on construction) and the
named presets that hold each paper's settings (:mod:`flnotes.config.presets`).

This layer sits above algorithms, data and models (it checks names against their
registries) and below the engine, which only reads a config.
"""

from flnotes.config.runconfig import (
    BACKENDS,
    COMPILE_MODES,
    DEFAULT_MODEL,
    PARTITIONS,
    WEIGHTINGS,
    RunConfig,
    common_field_names,
    config_field_names,
    field_names,
    model_names,
)

__all__ = ["BACKENDS", "COMPILE_MODES", "DEFAULT_MODEL", "PARTITIONS", "WEIGHTINGS",
           "RunConfig", "common_field_names", "config_field_names", "field_names",
           "model_names"]
