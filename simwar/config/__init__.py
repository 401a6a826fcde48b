"""The config: what one simulated run is, validated, with one-line errors.

``from simwar.config import load_config`` (and the names below) is the API; the submodules:

- :mod:`simwar.config.schema`: the top-level Config and its sections, the rules later layers
  share (graph buckets, engine and algorithm names, which batch each duration uses); every
  public name of the modules below it is importable from it too;
- :mod:`simwar.config.base`: the strict base model and the one-line error;
- :mod:`simwar.config.durations`: durations (numbers, distributions, affine) and accepted
  tokens;
- :mod:`simwar.config.phases`: the phase table and how a config's algorithm resolves to it;
- :mod:`simwar.config.workload`: the workload, one model per batch source;
- :mod:`simwar.config.shapes`: iteration shapes: the prefill, its token-priced durations, the
  idle batch and the scheduling rule;
- :mod:`simwar.config.load`: YAML files, dotted overrides, the files a config names (read
  here, not by the validation), validation, the error's blame;
- :mod:`simwar.config.algorithms`: the built-in phase tables (plain data);
- :mod:`simwar.config.policies`: barrier policies and the read-done publish rule;
- :mod:`simwar.config.cache`: the cache of validated configs that ``simwar run`` reads a
  repeat run's config from (imported by the command, not here).

Imports: pydantic and yaml (through schema and load); nothing from build, executors or above.
"""

from __future__ import annotations

from simwar.config.load import (
    DEFAULT_CONFIG,
    Override,
    load_config,
    override_list,
    parse_override,
    parse_slo,
    read_yaml,
    resolve_paths,
    set_dotted,
    validate,
)
from simwar.config.schema import (
    ALGORITHMS,
    ENGINES,
    Affine,
    Config,
    ConfigError,
    Dist,
    Phase,
    Policy,
    Workload,
    buckets_of,
    duration_keys,
    finite_error,
    first_error,
    non_finite,
)

__all__ = ["ALGORITHMS", "DEFAULT_CONFIG", "ENGINES", "Affine", "Config", "ConfigError", "Dist",
           "Override", "Phase", "Policy", "Workload", "buckets_of", "duration_keys",
           "finite_error", "first_error", "load_config", "non_finite", "override_list",
           "parse_override", "parse_slo", "read_yaml", "resolve_paths", "set_dotted",
           "validate"]
