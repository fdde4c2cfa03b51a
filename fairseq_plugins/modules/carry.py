"""What a stream-carry idea is to the one stack that runs it (modules/carry_stack.py): a ``Carry``.

An idea that changes what passes between sublayers (n streams, fractions of the stream, a softmax over earlier
outputs) is two things: a connection module per residual site, ``forward(state, sublayer) -> state`` with
``sublayer`` the Pre-LN branch h -> dropout(F(LN(h))), and the carry that the stack threads through its layers:

    state = carry.begin(stack, x)            x: the embedding output (seq_len, batch, embed_dim)
    state = site(state, sublayer)            each sublayer of each layer (carry.site builds the sites)
    y     = carry.layer_output(state)        a layer's reported output (fairseq's inner_states)
    out   = carry.end(stack, y, state)       the stack output before its final LayerNorm

A ``Carry`` is a declaration, not a module: it holds the idea's options, builds the sites and the stack-level
modules (``stack_modules``, registered on the encoder or decoder under their own names, so checkpoints keep
their keys), and owns no weights itself. This base class is the residual stream itself, the carry of an idea
whose sites act on the ordinary C-wide stream (frac-connections). Each idea's carry is declared beside its
module: ``StreamCarry`` (modules/mhc.py: hyper-connections and mHC), ``FracCarry`` (frac_connections.py),
``AttnResCarry`` (attn_res.py).
"""

from typing import Any

from torch import Tensor, nn


class Carry:
    """The carry of one stack (module docstring); these defaults thread the stream x itself."""

    # the state-dict buffer ``{version}_version`` the stack records (layer_stack.add_format_version): the carries
    # were hyper-connections' stack subclasses when their checkpoints were first written, under HC's name
    version = "hc"

    def site(self, embed_dim: int, index: int) -> nn.Module:
        """The connection of residual site ``index`` (counted through the stack: 2 per encoder layer, 3 per
        decoder layer, 2 without cross-attention), with ``forward(state, sublayer) -> state``."""
        raise NotImplementedError

    def stack_modules(self, embed_dim: int, sites: int) -> dict[str, nn.Module]:
        """Modules of the whole stack, by attribute name, built after its ``sites`` sites."""
        return {}

    def begin(self, stack: nn.Module, x: Tensor) -> Any:
        return x

    def layer_output(self, state: Any) -> Tensor:
        return state

    def end(self, stack: nn.Module, x: Tensor, state: Any) -> Tensor:
        """``x`` is the last layer's output (the embedding output if the stack has no layers)."""
        return x
