"""
The report, from results.json alone: every experiment's tables (REPORT.md) and figures, each made
by its module in reproduction/experiments/ (its tables() and figures(); the tuning's when it has none).
"""

from reproduction import plan
from reproduction.experiments import MODULES
from reproduction.figures import tuning_figures
from reproduction.plan import arm_flags, cell_of
from reproduction.tables import rate_text, tuning_tables


def made(results, only=None):
    """Every table of the report (only: of that experiment), made from results.json alone: [(experiment,
    title, maker, markdown)], maker the function whose docstring is its caption; an experiment module's
    tables(), else its tuning's."""
    out = []
    for name, exp in plan.EXPERIMENTS.items():
        runs = [r for r in results["runs"] if r["experiment"] == name]
        if runs and only in (None, name):
            module = MODULES.get(name)  # --blocks' compare experiment has none
            tables_of = getattr(module, "tables", lambda runs, exp, results: tuning_tables(runs, exp))
            out += [(name, title, maker, markdown) for title, maker, markdown in tables_of(runs, exp, results)]
    return out


def tables(results, only=None):
    """The README's tables, made from results.json alone: [(experiment, title, markdown)]."""
    return [(name, title, markdown) for name, title, _, markdown in made(results, only)]


def so_far_table(runs):
    """The finished runs of tuning arms not finished yet, as they ended (as their experiment's module
    shows them where it has a so_far(): a search over pairs as grids)."""
    if runs and (shown := getattr(MODULES.get(runs[0]["experiment"]), "so_far", None)):
        return shown(runs)
    lines = ["| point | config | lr | seed | final val loss | status |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["steps"], r["n_layer"], r["n_embd"], str(arm_flags(r)), r["config"], r["lr"],
                                     r["flags"].get("emb_lr", r["lr"]), r["flags"].get("muon_lr", 0), r["seed"])):
        point = ", ".join([cell_of(r).label if r["objective"] == "clm" else f"{r['n_layer']}x{r['n_embd']}, {r['steps']} steps",
                           *(f"{k} {v:g}" for k, v in arm_flags(r).items())])
        loss = "" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
        lines.append(f"| {point} | {r['config']} | {rate_text(r)} | {r['seed']} | {loss} | {r['status']} |")
    return "\n".join(lines)


METHOD = """## How it is run

The data is Python's standard library, as bytes (a vocabulary of 257), as GPT-2's BPE tokens
(50,257), or as GPT-2's BPE cut to its first N tokens (`prepare_data.py --vocab N`): the same
text. Every run, unless its cell says otherwise: T 128 tokens a sequence, 16 sequences a step,
AdamW (the muon experiment's `_muon` arms: Muon on the blocks' matrices), linear warmup then linear
decay to 0, in float32 on CPU.

**Every block is tuned alike** (the paper tuned each model's peak learning rate on a grid): a
sweep of 1e-3 to 8e-3 on the first seed (muon_rates: a grid of pairs, Muon's rate and AdamW's), grown by
factors of 2 while the best rate is at an edge;
its two best rates on a second seed; the better of those on a third (`--quick`: 2 seeds in all). A seed sets the initial
weights and the batch order, the same for every block, so blocks compare **seed by seed**: each
gap is the paired gap to Pre-LN, its mean and range over the seeds. A run that **stalls** (its
validation loss stuck at the unigram level: token frequencies alone) or diverges is counted,
never dropped. Seconds per step come from bench.py (every block in one process, steps
interleaved), not from the runs' own clocks.

**The factor study** (`--experiment regime`) tunes Pre-LN, SAS and SAS-P alike in *cells*, each a
model shape, run length, batch, warmup and vocabulary, varying one factor at a time. **The rule**
(`chosen_regime`), written before any cell ran: of the batch-16, T-128 regimes in which every
tuned rate trained on every seed, the one closest to the paper's recipe: its kind of tokens (BPE)
first, then its proportions (d_k 64, width : depth >= 40), then the longer warmup; never the gaps.
It chose GPT-2 BPE, 6 x 256, 4 heads, 20% warmup: the GPT comparison (`python reproduce.py`) runs
there. `--quick`'s regime has a rule of its own (`quick_regime`), written before its candidates ran.
"""


def write_report(results, assets):
    """REPORT.md beside results.json: the method, every table made from results.json, and the figures."""
    recorded = [r for r in results["runs"] if isinstance(r.get("code", {}).get("settings"), dict)]
    lines = ["# The reproduction's full tables", "",
             "Written by reproduce.py from [results.json](results.json) (every run, with its curve); do not edit.", "",
             METHOD, f"**Reuse.** {len(recorded)} of these {len(results['runs'])} runs recorded what made them (their "
             "settings as train.py resolved them, and the probe's numbers: `protocol.stale`), and stand in for training "
             f"them again where the code still computes what it did ({', '.join(sorted({r['experiment'] for r in recorded})) or 'none'});"
             " the others, made by earlier code, are reported and never reused.", ""]
    seen = set()

    def unfinished(experiment):  # what of it is not finished, and its finished runs there, once
        seen.add(experiment)
        left = results["experiments"].get(experiment, {}).get("unfinished")
        so_far = results["experiments"].get(experiment, {}).get("so_far")
        return ([f"*{experiment}, not finished yet:* " + "; ".join(left), ""] if left else []) + (
            [f"*{experiment}, the finished runs of what is not finished* (no verdict until its arm is done):", "",
             so_far_table(so_far), ""] if left and so_far else [])

    for experiment, title, maker, markdown in made(results):
        if experiment not in seen:
            lines += unfinished(experiment)
        caption = " ".join(maker.__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
        lines += [f"## {experiment}: {title}", "", caption, "", markdown, ""]
    for experiment in results["experiments"]:  # an experiment none of whose arms has finished yet
        if experiment not in seen and (more := unfinished(experiment)):
            lines += [f"## {experiment}", "", *more]
    lines += ["## Figures", ""] + [f"![{png.stem}]({png.name})" for png in sorted(assets.glob("*.png"))]
    (assets / "REPORT.md.tmp").write_text("\n".join(lines) + "\n")
    (assets / "REPORT.md.tmp").replace(assets / "REPORT.md")


def figures(name, results, assets):
    """The README's figures for an experiment, from results.json alone."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    prefix = "" if name == "clm" else f"{name}_"
    for figure_name, fig in drawn(plt, name, results).items():
        fig.tight_layout()
        fig.savefig(assets / f"{prefix}{figure_name}.png", dpi=110)
        plt.close(fig)


def drawn(plt, name, results):
    """{name: figure} of an experiment: its module's figures(), else its tuning's."""
    exp, runs = plan.EXPERIMENTS[name], [r for r in results["runs"] if r["experiment"] == name]
    tunes = "rates" not in exp and not any("cells" in scale for scale in exp["scales"].values())  # a sweep to draw
    default = lambda plt, runs, exp, results: tuning_figures(plt, runs, exp) if tunes else {}
    return getattr(MODULES.get(name), "figures", default)(plt, runs, exp, results)
