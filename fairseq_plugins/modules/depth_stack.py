"""The stack of earlier layer outputs that DeepCrossAttention's GRNs read, and its k-DCA form.

Heddes et al., "DeepCrossAttention" (arXiv:2502.06785), sections 3.1 ("Reducing memory and computation")
and 5. Before layer t the stack holds, per token, the embedding x and the outputs f_0 ... f_{t-1} of the
earlier layers (a layer's output is its sub-block outputs without its input, see dca.py).

k-DCA keeps the embedding, the *sum* of the middle outputs and the last k outputs:

    G_t = [x, f_0 + ... + f_{t-k-1}, f_{t-k}, ..., f_{t-1}]      (at most k + 2 entries)

Interpretation: the paper's "first and last-k layers" is read as its own k = 2 example spells out (the model
input, the sum of the intermediate outputs, the last two outputs). The middle sum is kept (the public port
drops it), because without it the plain sum of the stack is no longer x + f_0 + ... + f_{t-1} and the model
stops being its residual network at initialisation. The middle sum is a running sum: one addition per layer
(each layer's sum is a new tensor, kept for that layer's backward). The embedding never joins it. k >= L - 1
(L layers) never forms a middle sum and is stored as k = 0; GRN sizes are the same either way.

Memory and speed: every output is written once into a buffer preallocated for the whole forward pass
(DenseFormer's trick, in the model's dtype, so half precision stays half); a GRN reads a window of it as a
tensor that aliases the buffer, so nothing is concatenated per layer and backward saves no copies. A window
costs O(entries read), so the per-layer cost of k-DCA does not grow with depth.

Under torch.compile the stack is a plain list and a window is ``torch.stack`` of its entries: the aliasing
above (``Tensor.set_``, data pointers) cannot be traced, and the compiler plans the memory itself. A stack begun
outside compiled code and pushed to inside it turns into a list at that push (the same values either way).
"""

import torch
from torch import Tensor

from .grn import GRN, GRN_CLASSES, GRNv3


def _alias(buffer: Tensor, view: Tensor) -> Tensor:
    """A tensor of its own on the memory of ``view``, a view of ``buffer``.

    Not a view in autograd's sense: later writes to other slots of the buffer bump the buffer's version
    counter, which would invalidate every earlier window saved for backward if the windows were views.
    Slots are written once and never overwritten, so a window's memory never changes after it is read.
    """
    return buffer.new_empty(0).set_(buffer.untyped_storage(), view.storage_offset(), view.size(), view.stride())


class _Write(torch.autograd.Function):
    """Copy x into buffer[index]; return that slot, whose gradient flows back to x."""

    @staticmethod
    def forward(ctx, buffer: Tensor, index: int, x: Tensor) -> Tensor:
        buffer[index].copy_(x)
        return _alias(buffer, buffer[index])

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, grad


class _Read(torch.autograd.Function):
    """buffer[start:stop] as one tensor; its gradient is split between the slots written there."""

    @staticmethod
    def forward(ctx, buffer: Tensor, start: int, stop: int, *slots: Tensor) -> Tensor:
        return _alias(buffer, buffer[start:stop])

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, None, *grad.unbind(0)


class DepthStack:
    """The stack of one forward pass (encoder or decoder): created from the embedding, one ``push`` per layer.

    Args:
        x: embedding output `(seq_len, batch, embed_dim)`, the first entry.
        num_layers: layers that will push an output (sizes the buffer).
        k: keep the last k outputs explicitly and sum the older ones (k-DCA); 0 keeps every output.
    """

    def __init__(self, x: Tensor, num_layers: int, k: int = 0):
        self.k = k
        # without autograd (decoding) nothing is saved for backward, so the k-DCA middle sum is kept in one more
        # slot and updated in place, and the GRNs of all layers write into one workspace (grn_out): a layer is
        # done with its GRN outputs before the next one runs. Fewer, smaller allocations per decoding step.
        self.in_place = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        self.buffer: Tensor | None = None  # None: a plain list (under torch.compile, module docstring)
        if not torch.compiler.is_compiling():
            self.buffer = x.new_empty(num_layers + 1 + (1 if k and self.in_place else 0), *x.shape)
        self.slots: list[Tensor] = []
        self.middle: Tensor | None = None
        self.workspace: tuple[Tensor, Tensor] | None = None
        self.push(x)

    def push(self, f: Tensor) -> None:
        """Append one layer output f: `(seq_len, batch, embed_dim)`."""
        index = len(self.slots)
        if torch.compiler.is_compiling():
            self.buffer, self.in_place = None, False  # from here on a list (module docstring)
        if self.buffer is None:
            self.slots.append(f)
        elif torch.is_grad_enabled():
            self.slots.append(_Write.apply(self.buffer, index, f))
        else:
            slot = self.buffer[index]
            if f.data_ptr() != slot.data_ptr():  # not written in place (next_slot)
                slot.copy_(f)
            self.slots.append(slot)
        if self.k and index - self.k >= 1:  # output index - k leaves the window; the embedding never does
            leaving = self.slots[index - self.k]
            if self.in_place:
                middle = self.buffer[-1]
                middle.copy_(leaving) if self.middle is None else middle.add_(leaving)
                self.middle = middle
            else:
                self.middle = leaving if self.middle is None else self.middle + leaving

    def next_slot(self) -> Tensor | None:
        """Without autograd, the buffer slot the next push fills, for a layer to write its output into (push
        then copies nothing); else None."""
        return self.buffer[len(self.slots)] if self.in_place and not torch.compiler.is_compiling() else None

    def grn_out(self, outputs: int) -> tuple[Tensor, Tensor] | None:
        """Without autograd, the outputs (x[0], h) of a GRN with ``outputs`` outputs, shared by the GRNs of this
        pass (the last one's h is the encoder's or decoder's output, which nothing overwrites); else None."""
        if not self.in_place or torch.compiler.is_compiling():
            return None
        if self.workspace is None or self.workspace[1].size(0) < outputs:
            x = self.slots[0]
            self.workspace = (x.new_empty(x.shape), x.new_empty(outputs, *x.shape))
        return self.workspace[0], self.workspace[1][:outputs]

    @property
    def last(self) -> Tensor:
        """The newest entry, on the buffer's memory (fairseq's inner_states keep it without a copy)."""
        return self.slots[-1]

    def _window(self, start: int, stop: int) -> Tensor:
        if stop - start == 1:
            return self.slots[start].unsqueeze(0)
        if self.buffer is None or torch.compiler.is_compiling():
            return torch.stack(self.slots[start:stop])
        if torch.is_grad_enabled():
            return _Read.apply(self.buffer, start, stop, *self.slots[start:stop])
        return self.buffer[start:stop]

    def chunks(self) -> list[Tensor]:
        """The stack as chunks (entries, seq_len, batch, embed_dim), in order: embedding, middle sum, last k."""
        n = len(self.slots)
        if self.middle is None:
            return [self._window(0, n)]
        return [self._window(0, 1), self.middle.unsqueeze(0), self._window(n - self.k, n)]

    def plain_sum(self) -> Tensor:
        """G 1: what a residual network feeds the next layer (for tests and analysis)."""
        return sum(c.sum(0) for c in self.chunks())


def effective_k(k: int, num_layers: int) -> int:
    """k as the stack uses it: k >= num_layers - 1 never forms a middle sum, the same model as k = 0 (all)."""
    return k if k < num_layers - 1 else 0


def stack_entries(layer: int, k: int) -> int:
    """Entries the stack holds before layer ``layer`` (0-based; ``layer = num_layers`` for the output GRN)."""
    return layer + 1 if k == 0 else min(layer + 1, k + 2)


# --dca-mode -> (GRN class, outputs of a layer's GRN). The GRN-vX modes are the ablation of the paper's
# table 7: one GRN per layer gives its input (queries, keys and values alike). dca: three GRN-v3 give the
# self-attention's queries, keys and values (section 3.2). The output y = GRN(G_{T+1}) of an encoder or
# decoder (section 3.1) is one GRN of the same class.
DCA_MODES: dict[str, tuple[type[GRN], int]] = {
    **{version: (cls, 1) for version, cls in GRN_CLASSES.items()},
    "dca": (GRNv3, 3),
}


def build_grn(mode: str, embed_dim: int, num_entries: int, output: bool = False) -> GRN:
    """The GRN of a layer (or, with ``output``, of the encoder's or decoder's output) in ``mode``."""
    cls, outputs = DCA_MODES[mode]
    return cls(embed_dim, num_entries, 1 if output else outputs)
