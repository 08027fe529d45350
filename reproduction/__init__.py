"""
The reproduction behind reproduce.py (its docstring: the protocol), one question a file:

    plan.py         what is run: the configs, a run and its folder, a factor-study cell, scale points
    experiments/    one module an experiment: its question and rule, its runs' spec, its tables and figures
    protocol.py     how it is run: the tuning protocol, training a run or reading it back, locks
    measure.py      seconds per step (bench.py), token similarity at init, the identity start's departure
    tables.py       the statistics of a verdict, results.json's rows, the tables of any tuning
    figures.py      the figures of any tuning, and --plot
    report.py       REPORT.md and the figures, each experiment's made by its module
    zero_init.py    a block of its own: Pre-LN started as the identity (the identity experiment)

Arrows only go down: report -> experiments -> figures -> tables -> protocol, measure -> plan;
nothing here imports reproduce.py. The registries (CONFIGS, COLORS, EXPERIMENTS) and settings
(TRAINING, OUT, GRID, ...) live in plan.py alone, the registries read as plan.NAME at call time, so
that --blocks, and a test that patches one, reach every module; loading this package fills EXPERIMENTS.
"""

from reproduction import experiments  # noqa: F401 (fills plan.EXPERIMENTS)
