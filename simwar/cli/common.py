"""What every ``simwar`` subcommand shares: its error type, its JSON and number formatting,
the stall summary that ``run`` and ``import`` both print, and the costs files that ``run``
and ``compare`` both read.

A leaf module: ``simwar.cli.app`` and the ``cli_*`` modules import from here, never from each
other, so there is no import cycle between the command line's modules.

Imports: the standard library (and ``simwar.core.files``).
"""

from __future__ import annotations

from simwar.core.files import jsonable

__all__ = ["UserError", "costs_file_overrides", "costs_overrides", "jsonable", "num",
           "read_costs_file", "run_label", "stall_lines"]


class UserError(Exception):
    """An error the user can fix; printed as one line."""


COSTS_FILE_KEYS = ("costs", "phases")
#: keys a ``simwar calibrate`` file carries to describe itself; they set nothing
CALIBRATION_INFO_KEYS = ("format", "version", "device", "spin", "fitted_from", "primitives",
                         "host_drift")


def read_costs_file(path: str, option: str = "--costs") -> tuple[dict, list[dict]]:
    """``(costs, phase entries)`` of a costs file; a key it would not use is an error."""
    from simwar.config import ConfigError, read_yaml

    try:
        data = read_yaml(path)
    except ConfigError as e:
        raise UserError(f"{option} {e}") from None
    where = f"{option} {path}"
    info = CALIBRATION_INFO_KEYS if data.get("format") == "simwar.calibration" else ()
    for key in data:
        if key not in COSTS_FILE_KEYS and key not in info:
            raise UserError(f"{where}: {key}: not used (a costs file sets 'costs' and "
                            f"'phases' only)")
    if not any(key in data for key in COSTS_FILE_KEYS):
        raise UserError(f"{where}: expected a 'costs' mapping or a 'phases' list")
    costs = data.get("costs", {})
    if not isinstance(costs, dict):
        raise UserError(f"{where}: costs: expected a mapping of cost names to µs")
    phases = data.get("phases", [])
    if not isinstance(phases, list):
        raise UserError(f"{where}: phases: expected a list of phases, each with a 'name'")
    for i, entry in enumerate(phases):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UserError(f"{where}: phases.{i}: expected a mapping with a 'name'")
    return costs, phases


def costs_overrides(path: str | None) -> dict:
    """``{costs.KEY: value}`` of a costs file, for commands that apply costs only."""
    if not path:
        return {}
    costs, phases = read_costs_file(path)
    if phases:
        raise UserError(f"--costs {path}: phases: only costs apply here (each case keeps its "
                        f"own phases)")
    return {f"costs.{k}": v for k, v in costs.items()}


def costs_file_overrides(path: str, phase_names: list[str]) -> list:
    """The overrides of a costs file for a config whose phases are ``phase_names``."""
    from simwar.config import Override

    costs, phases = read_costs_file(path)
    origin = f"--costs {path}"
    items = [Override(f"costs.{k}", v, origin) for k, v in costs.items()]
    for i, entry in enumerate(phases):
        name = entry["name"]
        if name not in phase_names:
            raise UserError(f"{origin}: phases.{i}.name: '{name}' is not a phase of the config "
                            f"({', '.join(phase_names)})")
        items += [Override(f"phases.{name}.{k}", v, origin) for k, v in entry.items()
                  if k != "name"]
    return items


def num(value, spec: str = ".1f") -> str:
    """``format(value, spec)``, never ``-0.0`` (a tiny negative rounds to plain zero)."""
    text = format(value, spec)
    if text.startswith("-") and not any(c in "123456789" for c in text):
        text = text[1:]
    return text


def run_label(name: str, overrides: list) -> str:
    """The config's name, followed by what the command line changed in it."""
    changed = list(dict.fromkeys(o.origin for o in overrides if o.key != "name"))
    return f"{name} [{', '.join(changed)}]" if changed else name


def stall_lines(s: dict) -> list[str]:
    """The stall figures of a summary (simulated or measured), one line each."""
    f = num
    blocked = ", ".join(f"{k[len('cpu_blocked_'):-len('_us_mean')]} {f(v)}"
                        for k, v in s.items()
                        if k.startswith("cpu_blocked_") and k.endswith("_us_mean")
                        and k != "cpu_blocked_us_mean" and v > 0)
    return [
        f"  step time           mean {f(s['step_us_mean'])} µs   p50 {f(s['step_us_p50'])}"
        f"   p99 {f(s['step_us_p99'])}",
        f"  forward             {f(s['fwd_us_mean'])} µs; gap before it "
        f"{f(s['fwd_gap_us_mean'])} µs",
        f"  GPU idle (forward)  {f(s['gpu_idle_us_mean'])} µs/step "
        f"(waiting on a dependency {f(s['gpu_idle_dep_us_mean'])}, "
        f"on the host {f(s['gpu_idle_host_us_mean'])}); busy "
        f"{f(100 * s['gpu_busy_fraction'])}%",
        f"  CPU blocked         {f(s['cpu_blocked_us_mean'])} µs/step {blocked}".rstrip(),
        f"  launch lead         mean {f(s['launch_lead_us_mean'])} µs; run-ahead fraction "
        f"{f(s['run_ahead_fraction'], '.3f')}",
        f"  launch-ahead depth  mean {f(s['launch_ahead_mean'], '.3f')}; histogram "
        + ", ".join(f"{k}: {f(v, '.2f')}" for k, v in s["launch_ahead_hist"].items()),
    ]
