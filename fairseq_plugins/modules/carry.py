"""What an idea that threads state through the layers is to the one stack that runs it (modules/carry_stack.py):
a ``Carry``.

Two kinds of idea share it. A stream-carry idea changes what passes between sublayers (n streams, fractions of
the stream, a softmax over earlier outputs): it is a connection module per residual site, ``forward(state,
sublayer) -> state`` with ``sublayer`` the Pre-LN branch h -> dropout(F(LN(h))), and the stack builds its own
layers from the carry's site factory. A between-layer idea (DenseFormer, DLCL, LAuReL) treats each layer as a
black box x -> y built by the residual axis, and changes only what a layer reads and what follows it. The stack
threads the carry through its layers:

    state = carry.begin(stack, x)                       x: the embedding output (seq_len, batch, embed_dim)
    y     = carry.call_layer(stack, i, layer, x, state, **masks)
          = layer(carry.layer_input(stack, i, x, state), **masks)   by default; x: layer i-1's reported output
    x, state = carry.after_layer(stack, i, x, y, state) layer i's reported output (fairseq's inner_states)
    out   = carry.output(stack, x, state)               the stack output: its final LayerNorm of carry.end(...)

An idea whose layers read their inputs in their own way (DCA: GRN mixtures of the depth stack as queries, keys
and values) builds them (``encoder_layer``/``decoder_layer``) and calls them (``call_layer``) itself.

A ``Carry`` is a declaration, not a module: it holds the idea's options, builds the sites and the stack-level
modules (``stack_modules``, registered on the encoder or decoder under their own names, so checkpoints keep
their keys), and owns no weights itself. This base class is the residual stream itself, the carry of an idea
whose sites act on the ordinary C-wide stream (frac-connections); its ``layer_input``/``after_layer`` hand a
stream carry's layer the whole state and report ``layer_output(state)``. Each idea's carry is declared beside
its module: ``StreamCarry`` (modules/mhc.py: hyper-connections and mHC), ``FracCarry`` (frac_connections.py),
``AttnResCarry`` (attn_res.py), ``DenseFormerCarry`` and ``DLCLCarry`` (depth_aggregation.py), ``LaurelCarry``
(laurel.py), ``DCACarry`` (dca.py), ``MUDDCarry`` (muddformer.py).
"""

from typing import Any

from torch import Tensor, nn


class Carry:
    """The carry of one stack (module docstring); these defaults thread the stream x itself."""

    # the state-dict buffer ``{version}_version`` the stack records (layer_stack.add_format_version): the carries
    # were hyper-connections' stack subclasses when their checkpoints were first written, under HC's name; None:
    # none (MUDD's checkpoints have none)
    version: str | None = "hc"
    # why torch.jit.script refuses the stack (layer_stack.py's refusal); None: the stack's own reason
    torchscript_unsupported_reason: str | None = None

    def encoder_layer(self, cfg, index: int) -> nn.Module | None:
        """Encoder layer ``index``, or None for the stack's Pre-LN layers on this carry's sites."""
        return None

    def decoder_layer(self, cfg, index: int, no_encoder_attn: bool) -> nn.Module | None:
        """Decoder layer ``index``, or None for the stack's Pre-LN layers on this carry's sites."""
        return None

    def site(self, embed_dim: int, index: int) -> nn.Module:
        """The connection of residual site ``index`` (counted through the stack: 2 per encoder layer, 3 per
        decoder layer, 2 without cross-attention), with ``forward(state, sublayer) -> state``."""
        raise NotImplementedError

    def stack_modules(self, embed_dim: int, sites: int, layers: int) -> dict[str, nn.Module]:
        """Modules of the whole stack, by attribute name, built after its ``layers`` layers and their ``sites``
        sites (0 for a between-layer idea, whose layers the residual axis builds)."""
        return {}

    def begin(self, stack: nn.Module, x: Tensor) -> Any:
        return x

    def layer_input(self, stack: nn.Module, idx: int, x: Tensor, state: Any) -> Any:
        """What layer ``idx`` reads; ``x`` is the previous layer's reported output (the embedding output for
        layer 0). A stream carry's layer reads the whole state."""
        return state

    def call_layer(self, stack: nn.Module, idx: int, layer: nn.Module, x: Tensor, state: Any, **kwargs) -> Any:
        """Run layer ``idx`` with the stack's keyword arguments (masks, encoder output, incremental state)."""
        return layer(self.layer_input(stack, idx, x, state), **kwargs)

    def after_layer(self, stack: nn.Module, idx: int, x: Tensor, y: Any, state: Any) -> tuple[Tensor, Any]:
        """Layer ``idx`` read ``layer_input``'s value and returned ``y``: its reported output and the new state.
        A stream carry's layer returns the new state."""
        return self.layer_output(y), y

    def layer_output(self, state: Any) -> Tensor:
        return state

    def end(self, stack: nn.Module, x: Tensor, state: Any) -> Tensor:
        """``x`` is the last layer's output (the embedding output if the stack has no layers)."""
        return x

    def output(self, stack: nn.Module, x: Tensor, state: Any) -> Tensor:
        """The stack output: ``end``, then the stack's final LayerNorm if it has one."""
        out = self.end(stack, x, state)
        return stack.layer_norm(out) if stack.layer_norm is not None else out
