"""The registry of statistics: every statistic the engine computes by name, gathered explicitly from
the modules that declare them (`statistics.py`, `released.py`, `bootstrap.py`), and any a caller
registers (`register_statistic`). Importing it registers nothing behind anyone's back: the declaring
modules only list their statistics. The presentation of every measure (`Measure`: its label, chart
title, estimator, what its n counts, its baseline, the bootstrap's unit) comes from here too, for the
CLI, the report, `compare` and the bootstrap.
"""

from __future__ import annotations

from lmgeom.engine import bootstrap, released, statistics
from lmgeom.engine.statistics import Measure, PairStatistic, Statistic
from lmgeom.errors import InputError

_STATISTICS: dict[str, Statistic] = {stat.name: stat for module in (statistics, released, bootstrap) for stat in module.STATISTICS}
_PAIR_STATISTICS: dict[str, PairStatistic] = {stat.name: stat for stat in statistics.PAIR_STATISTICS}


def register_statistic(stat: Statistic) -> Statistic:
    """Make `stat` computable by name (`AnalysisOptions(statistics=(..., stat.name))`); a caller's own
    statistic (its functions at module level: a plan is pickled to worker processes)."""
    _STATISTICS[stat.name] = stat
    return stat


def statistic(name: str) -> Statistic:
    if name not in _STATISTICS:
        raise InputError(f"unknown statistic {name!r} in `statistics`; registered: {', '.join(_STATISTICS)}", param="statistics")
    return _STATISTICS[name]


def registered_statistics() -> tuple[str, ...]:
    return tuple(_STATISTICS)


def pair_statistics_for(measures: tuple[str, ...]) -> tuple[PairStatistic, ...]:
    """The pair statistics that give any of `measures`."""
    return tuple(stat for stat in _PAIR_STATISTICS.values() if set(stat.measures) & set(measures))


def measures() -> tuple[Measure, ...]:
    """Every per-layer measure of the registered statistics, in their order: what the CLI's tables,
    the report's charts, `compare` and the bootstrap iterate."""
    return tuple(measure for stat in _STATISTICS.values() for measure in stat.measures)


def measure(name: str) -> Measure:
    """The measure of the records' metric `name` (`mev_centred`, `self_similarity`)."""
    for candidate in measures():
        if candidate.name == name:
            return candidate
    raise InputError(f"no registered statistic has the measure {name!r}; measures: {', '.join(m.name for m in measures())}",
                     param="metric")
