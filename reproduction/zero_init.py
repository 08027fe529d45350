"""Pre-LN started as the identity map: its two output matrices (attention's W^P, the MLP's W2)
zero at init, so a block adds nothing to the residual stream until they train, as SAS and SAS-P
start (shaped attention is the identity at init, their MLP branch down-weighted). Nothing else of
Pre-LN changes. A block of one's own, registered as the README shows: the identity experiment's
runs take it with --import."""

from torch import nn

from simple_gpt import BLOCKS, PreLN


class PreLNZero(PreLN):
    def init_paper(self):  # GPT calls it after GPT-2's init, so the zeros win
        nn.init.zeros_(self.attn.c_proj.weight)
        nn.init.zeros_(self.mlp.c_proj.weight)


BLOCKS["pre_ln_zero"] = PreLNZero
