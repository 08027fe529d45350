"""
One module per experiment, named as --experiment names it: its question and its rule (the docstring,
written before its runs), EXPERIMENT (its spec: what plan.py and protocol.py run), and where it has
more than its tuning's tables and figures, tables(runs, exp, results) -> [(title, maker, markdown)]
and figures(plt, runs, exp, results) -> {name: figure} (a check at fixed rates, or of cells, has no
tuning's figures to draw); what it measures beside its runs, measurements(runs, shape, held) -> dict,
kept in results.json (held: the last ones). Adding an experiment is adding a file.
"""

import importlib
import pkgutil

from reproduction import plan

names = sorted((info.name for info in pkgutil.iter_modules(__path__)), key=lambda name: (name != "clm", name))  # clm first
MODULES = {name: importlib.import_module(f"{__name__}.{name}") for name in names}
plan.EXPERIMENTS.update({name: module.EXPERIMENT for name, module in MODULES.items()})
