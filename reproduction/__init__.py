"""
The reproduction behind reproduce.py (its docstring: the protocol), one question a file:

    experiments.py  what is run: the configs, experiments, scale points, a run and its folder
    protocol.py     how it is run: the tuning protocol, training a run or reading it back, locks
    measure.py      seconds per step (bench.py) and token similarity at init
    tables.py       what it found: results.json's rows and every table, REPORT.md
    figures.py      what it looks like: the figures, --plot
    zero_init.py    a block of its own: Pre-LN started as the identity (the identity experiment)

Arrows only go down: figures -> tables -> protocol, measure -> experiments; nothing here imports
reproduce.py. The registries and settings (CONFIGS, COLORS, EXPERIMENTS, TRAINING, OUT, ...) live
in experiments.py alone and are read as ex.NAME at call time, so that --blocks, and a test that
patches one, reach every module.
"""
