"""
A run's resolved settings: what train.py makes of its flags (its device's preset, then the flags
given), each setting that can change what the run computes (not where it writes, whether it
resumes, or how often it logs; nor the device, whose kernels move its last bits as its threads
do), and the numeric constants of train.py (e.g. STALL_LEVEL). It imports nothing of the study,
so that it runs against another commit's train.py too:

    cd TREE && python PATH/TO/resolve.py < argvs.json      # [argv, ...] -> [settings, ...], as JSON
"""

import dataclasses
import json
import sys

# given: a field of TrainConfig before train_config.py (the flags given); vocab_size: the data's (its fingerprint)
NOT_COMPUTED = ("out_dir", "data_dir", "resume", "eval_interval", "log_interval", "imports", "given", "vocab_size", "device")


def resolved(argv, device="cpu"):
    """{setting: value} of train.py's run with argv on device."""
    import train
    try:
        import train_config
        cfg = train_config.settings(train_config.parse_args(argv), device)[0]
    except ImportError:  # code from before train_config.py: train.py resolved its settings itself
        cfg = train.resolve(train.parse_args(argv), device)[0]
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_COMPUTED}
    constants = {k: v for k, v in vars(train).items() if k.isupper() and type(v) in (int, float)}
    return json.loads(json.dumps({**settings, **constants}))


if __name__ == "__main__":
    sys.path.insert(0, ".")  # the tree it is run in, not this file's folder
    print(json.dumps([resolved(argv) for argv in json.load(sys.stdin)]))
