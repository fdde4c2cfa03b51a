"""torch.compile of what an idea adds to fairseq's encoder and decoder (issue 58: on a GPU every idea runs its
PyTorch code, and torch.compile, whose inductor emits Triton kernels, is how it gets fused).

``compile_ideas(model, **options)`` compiles in place every layer of the encoder and the decoder
(``nn.Module.compile``: parameter names and the state dict stay as they are) and, for a stack that threads a
carry between its layers (modules/layer_stack.py: DCA's depth stack, mHC's streams, AttnRes' state ...), its
``begin_layers``, ``run_layer`` and ``end_layers``. Every choice of every axis traces under
``fullgraph=True``, training and incremental decoding, with the kernels off (tests/test_compile.py); so do
fairseq's attention and FFN inside the layers. fairseq's loop around them (embedding, the padding checks,
which read data: ``if has_pads``) stays eager, which is why the model as a whole is not compiled.

Compile after any copy of the model (fairseq's ``--ema`` deep-copies it): the compiled code is bound to the
modules it was made from, so a copy would run the original's. ``--compile-ideas BACKEND`` calls it at the end of
``residual_axes``' build_model (models/axes_transformer.py, refused with ``--store-ema``); a training script may
call it on any built model.

Compiled incremental decoding traces each decoder layer about ten times (measured with the eager backend and
fairseq's beam search over three batch sizes: 17 graphs of the layer's forward at 2 layers, 43 at 4, 87 at 8):
fairseq keys each attention's cached keys and values by that module's own id, a constant the graph is guarded on,
and the first step (nothing cached), the second (a one-long cache is specialised), the later ones and a new batch
size each trace anew. The layers share one code object, so dynamo's default limit (8 graphs per code object)
would run every layer past the eighth graph eagerly after one warning: ``compile_ideas`` raises the limits by what
the model needs (``GRAPHS_PER_LAYER`` per layer of its deeper stack, plus ``SPARE_GRAPHS``; raised, never
lowered, by each compiled model, since models in one process share the code objects).

On the CPU the default stays eager with the fused C kernels: the whole model compiled (E6D6, width 256, one
thread) ran at 0.78 of eager after 374 s of compiling (issue 58). ``options`` are torch.compile's
(``backend``, ``fullgraph``, ``mode``, ``dynamic``).
"""

import torch
from torch import nn

HOOKS = ("begin_layers", "run_layer", "end_layers")
# the graphs a compiled model adds to one code object's cache (module docstring: about 10.5 per layer measured,
# DCA's encoder 3), with a margin
GRAPHS_PER_LAYER, SPARE_GRAPHS = 12, 8


def compile_ideas(model: nn.Module, **options) -> nn.Module:
    """Compile ``model``'s layers and layer-loop hooks in place (module docstring); returns ``model``."""
    stacks = _stacks(model)
    if stacks:
        needed = GRAPHS_PER_LAYER * max(len(stack.layers) for stack in stacks) + SPARE_GRAPHS
        torch._dynamo.config.recompile_limit += needed
        torch._dynamo.config.accumulated_recompile_limit += needed
    for stack in stacks:
        for layer in stack.layers:
            layer.compile(**options)
        for hook in HOOKS:
            if hasattr(stack, hook):
                # an instance attribute in front of the class's method: the loop's self.run_layer(...) finds it
                object.__setattr__(stack, hook, torch.compile(getattr(stack, hook), **options))
    return model


def _stacks(model: nn.Module) -> list[nn.Module]:
    """The encoder and the decoder of ``model`` that have layers (a language model has no encoder)."""
    stacks = (getattr(model, "encoder", None), getattr(model, "decoder", None))
    return [stack for stack in stacks if stack is not None and hasattr(stack, "layers")]
