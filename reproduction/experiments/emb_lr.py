"""
How much of the shaped blocks' lead is their own? Every comparison before this one gave a model one
AdamW rate, and with GPT-2's vocabulary the embedding (wte, tied to the output head, and wpe) is
most of the model (85% of the weights at 6 x 128): it got the rate the blocks' body tolerates. Here
every block is tuned alike over two rates, its body's (--lr) and its embeddings' (--emb_lr), in
three cells of the factor study, Pre-LN, SAS and SAS-P, 20% warmup, each block's one-rate best
rate r (its factor-study tuning in that cell, ONE_RATE) the centre of its search:

- the main job's cell (GPT-2 BPE, 6 x 128, 800 steps, float32): a grid of pairs, body r/2, r, 2r
  by embeddings r, 2r, 4r, 8r, 16r (both absolute), an axis grown by 2x while the best pair sits
  on its edge and trains; the whole grid on the first seed, its 2 best pairs on the second, the
  better mean on the third: the protocol's, on pairs (protocol.tune). A stalled run counts and
  falls back as there.
- the headline's cell (GPT-2 BPE, 6 x 256, 800 steps, in bf16: the bf16 check allows new cells
  there, and its runs are this cell's one-rate runs at r in bf16): the embeddings' rate carried
  from the main cell as an absolute rate (muP's view: an embedding's rate need not shrink with
  width), the body at r/2, r, 2r with it, then the embeddings at half and twice it at the best
  body rate; each stage's axis grown as the grid's; then the protocol's seeds on those pairs.
- the vocabulary study's bytes cell (6 x 256, 800 steps, float32, where the shaped blocks trail):
  each block at r with its carried embeddings' rate, on every seed: does the gap move?
- one control per block in the main cell, first seed, at its best pair: the embeddings' decay
  divided by the rates' ratio (AdamW's decay is decoupled: the same decay per step as one rate),
  so that the report says whether the rate or its decay moved the loss.

A pair whose embeddings' rate equals its body's is the one-rate run, the committed one (made by
earlier code, taken as it is: one setting, one result). The rule, written before any of its runs
(verdict_table): per cell, a shaped block leads with its embeddings' rate tuned if its paired gap
to Pre-LN, each at its best pair, is below zero on every seed; trails if above on every seed;
else level (the sign varies). Beside it: the one-rate gap (each at its one-rate best, the same
seeds), and the rate's share of the lead, one-rate gap minus two-rate gap (mean, points); the gap
without the first seed, whose grid chose the pairs; a best pair still on an edge of its search. Two
rates train every block better if each block's best pair ends below its one-rate run on every
seed of the main cell; then train.py's CPU preset gives each block its pair (when neither --lr
nor --emb_lr is given).
"""

from reproduction import plan, protocol
from reproduction.plan import Cell, cell_of
from reproduction.tables import finals, pair_grid, paired_gaps, spread, verdict
from train_config import TrainConfig

TUNED = ("pre_ln", "sas", "sas_p")
MAIN = Cell(6, 4, 128, 800, warmup_frac=0.2, tokens="bpe")
HEADLINE = Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")
BYTES = Cell(6, 4, 256, 800, warmup_frac=0.2)
BF16 = (HEADLINE,)  # the cells trained in bf16
# each block's one-rate best rate in each cell: the factor study's tuning (the headline's: the GPT comparison's)
ONE_RATE = {MAIN: dict(pre_ln=2e-3, sas=4e-3, sas_p=4e-3), HEADLINE: dict(pre_ln=2e-3, sas=4e-3, sas_p=2e-3),
            BYTES: dict(pre_ln=1e-3, sas=4e-3, sas_p=2e-3)}
ONE_RATE_RUNS = {MAIN: "regime", HEADLINE: "bf16", BYTES: "regime"}  # the experiment whose final runs are the one-rate arm


def planned(n_seeds):
    """The runs it trains: per block, the main cell's grid and the headline's two stages on the first
    seed, 2 and 1 on the others; the bytes cell on every seed; a control (the rates grown past not counted)."""
    later = 2 + n_seeds - 2 if n_seeds > 1 else 0
    return len(TUNED) * (15 + later + 1 + 5 + later + n_seeds)


EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=TUNED,
    scales={"default": dict(cells=[dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, steps=c.steps,
                                        warmup_frac=c.warmup_frac, tokens=c.tokens) for c in (MAIN, HEADLINE, BYTES)])},
    planned=planned)


def run_in(cell, config):
    run = cell.run(config)
    return run.again(flags=tuple(sorted(run.flags + (("dtype", "bfloat16"),)))) if cell in BF16 else run


def search(scale, seed_list, train_it):
    """Every run of the rule's searches, arm by arm as protocol.experiment's: ([(run, role, outcome)],
    [what is left out]); role sweep, check, final (the best pair), control (its decay), and so far."""
    rows, left_out, best = [], [], {}

    def arm(what, run, grid, train):  # trains it, or leaves it out (its finished runs: so far)
        nonlocal rows
        try:
            found = train()
            rows += found[0] if isinstance(found, tuple) else found
            return found
        except protocol.Unfinished as e:
            left_out.append(f"{what} (from {e})")
            if not train_it:
                rows += protocol.finished_so_far(run, seed_list, grid)

    for config in TUNED:
        r, run = ONE_RATE[MAIN][config], run_in(MAIN, config)
        grid = (("lr", (r / 2, r, 2 * r)), ("emb_lr", tuple(k * r for k in (1, 2, 4, 8, 16))))
        if found := arm(f"the main cell's {config}", run, grid, lambda: protocol.tune(run, seed_list, train_it, grid=grid)):
            best[config] = dict(found[1])
    for config, pair in best.items():
        if pair["emb_lr"] != pair["lr"]:
            control = protocol.at_rates(run_in(MAIN, config), tuple(pair.items()), seed=seed_list[0])
            decay = TrainConfig.weight_decay * pair["lr"] / pair["emb_lr"]
            control = control.again(flags=tuple(sorted(control.flags + (("emb_weight_decay", decay),))))
            arm(f"{config}'s decay control", control, None, lambda: [(control, "control", protocol.outcome(control, train_it))])
    for config, pair in best.items():
        r, run, carried = ONE_RATE[HEADLINE][config], run_in(HEADLINE, config), pair["emb_lr"]
        arm(f"the headline cell's {config}", run, (("lr", ()), ("emb_lr", ())),
            lambda: protocol.tune(run, seed_list, train_it, first=cross(run.again(seed=seed_list[0]), r, carried, train_it)))
    for config, pair in best.items():
        run = protocol.at_rates(run_in(BYTES, config), (("lr", ONE_RATE[BYTES][config]), ("emb_lr", pair["emb_lr"])))
        arm(f"the bytes cell's {config}", run, None,
            lambda: [(r, "final", o) for r, o in protocol.outcomes([run.again(seed=s) for s in seed_list], train_it).items()])
    if not any(role == "final" for _, role, _ in rows):
        raise protocol.Unfinished(left_out[0])
    return rows, left_out


EXPERIMENT["search"] = search


def cross(run, r, carried, train_it):
    """The headline cell's first seed: the body at r/2, r, 2r with the carried embeddings' rate, then
    the embeddings at half, once and twice it with the best body rate; {pair: outcome}."""
    body = protocol.sweep(run, train_it, (("lr", (r / 2, r, 2 * r)), ("emb_lr", (carried,))))
    lr = dict(min(body, key=lambda p: body[p].loss))["lr"]
    return {**body, **protocol.sweep(run, train_it, (("lr", (lr,)), ("emb_lr", (carried / 2, carried, 2 * carried))))}
