"""bf16 (or fp16) mixed precision through the plugin: ``--autocast-dtype {none,bfloat16,float16}``.

fairseq 0.12.3 cannot train in bfloat16 on a GPU: ``--bf16`` also sets ``--tpu`` and stops without XLA
(``'NoneType' object has no attribute 'xla_device'``), and ``--amp`` autocasts to float16 only (and runs
float32 on the CPU). ``--fp16`` (half-precision weights, loss scaling) is a different mechanism and stays as
it is. Under ``--autocast-dtype bfloat16``:

- the encoder's and the decoder's forward run inside ``torch.autocast(device_type=<device of the
  parameters>, dtype=torch.bfloat16)`` (PyTorch's automatic mixed precision, "torch.amp" docs), in
  training and in generation (fairseq-generate reads the option from the checkpoint's args; override it with
  ``--model-overrides "{'autocast_dtype': 'none'}"``): matrix products run in bfloat16;
- parameters, gradients and optimizer state stay float32 (the model is never cast; fairseq's FP32 optimizer);
- the numerically sensitive parts run in float32 with autocast switched off inside them (``Float32Forward``):
  every module class an axis choice declares in its ``float32`` (axes/__init__.py; read through
  ``axes.declarations()``): every LayerNorm (its statistics; PyTorch's CUDA autocast does this for
  ``layer_norm``, its CPU autocast does not, so the plugin does it on both) and RMSNorm, DCA's GRNs (the gates
  and the depth mix; on the CPU in float32 they also keep the fused kernels), DenseFormer's and DLCL's depth
  weights, LAuReL's mixing; and any module that declares ``autocast_float32 = True`` (the extension point for
  softmax over depth, Sinkhorn, ...). The computations a choice's own modules keep in float32 themselves are the
  strings of its ``float32`` (docs/grid.md lists them per choice);
- the loss is float32 (fairseq's criteria take ``log_softmax(logits.float())``), and the decoder returns its
  output logits as float32;
- the residual stream stays float32 by type promotion (float32 embedding + bfloat16 sublayer output), and so
  do the stacks DCA and DenseFormer keep of it. Not wrapped: Hyper-Connections' stream mixing (its module runs
  the attention/FFN sublayer inside its forward, so wrapping it would run the sublayer in float32 too; its
  mixing weights are tanh-bounded) and ResiDual's dual stream (float32 by promotion).

bfloat16 has float32's exponent range, so no loss scaling is needed (Micikevicius et al., "Mixed Precision
Training", arXiv:1710.03740, is the float16 case; Kalamkar et al., "A Study of BFLOAT16 for Deep Learning
Training", arXiv:1905.12322). ``float16`` autocast has no loss scaler here: use it for inference or short
checks, and fairseq's ``--fp16`` for training in float16.

Wiring: a model class lists ``AutocastModel`` before fairseq's ``TransformerModel`` in its bases; it adds
the option and, after building, calls ``enable_autocast(model, dtype)``. An encoder or decoder class may
instead list ``AutocastForward`` among its bases (the model then only sets ``autocast_dtype``). The Pre-LN/Post-LN
baselines are fairseq's ``TransformerModel`` with this mixin only (models/baselines.py); a script that builds a
model without the option (the benchmark's fairseq LM baseline) calls ``enable_autocast`` on the built model.
"""

import torch
from torch import nn

from .axes import declarations
from .validation import PluginOptionError, argparse_type, check_choice

AUTOCAST_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HALF = (torch.bfloat16, torch.float16)


def check_autocast_dtype(name: str, value) -> str:
    return check_choice(name, "none" if value is None else value, AUTOCAST_DTYPES)


def add_autocast_args(parser) -> None:
    """Register ``--autocast-dtype`` (validated: one of none, bfloat16, float16)."""
    parser.add_argument(
        "--autocast-dtype", type=argparse_type(check_autocast_dtype, "autocast_dtype"), metavar="DTYPE",
        help="none (default), bfloat16 or float16: run the encoder's and decoder's forward in torch.autocast "
        "with this dtype on the parameters' device (PyTorch automatic mixed precision; bfloat16: Kalamkar et al. "
        "arXiv:1905.12322); weights, optimizer state, LayerNorm statistics, depth mixing and the loss stay "
        "float32 (fairseq_plugins/precision.py). Not with --fp16/--memory-efficient-fp16/--bf16/--amp",
    )  # fmt: skip


def autocast_dtype(args) -> torch.dtype | None:
    """The autocast dtype ``args`` ask for (None: off), rejecting a clash with fairseq's own precision flags."""
    name = check_autocast_dtype("autocast_dtype", getattr(args, "autocast_dtype", None))
    if name != "none":
        clashes = [f"--{f.replace('_', '-')}" for f in ("fp16", "memory_efficient_fp16", "bf16", "amp")
                   if getattr(args, f, False)]  # fmt: skip
        if clashes:
            raise PluginOptionError(
                f"--autocast-dtype {name} cannot be used with {', '.join(clashes)}: those make fairseq cast the "
                "weights or autocast itself; --autocast-dtype keeps float32 weights and autocasts the forward"
            )
    return AUTOCAST_DTYPES[name]


def _device_type(module: nn.Module, inputs) -> str:
    for p in module.parameters():
        return p.device.type
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


def _to_float32(value):
    """Half-precision floating tensors (also inside lists, tuples, dicts) as float32; anything else as is."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _HALF else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    return value


def _refuse_script(module):
    raise RuntimeError(
        f"{type(module).__name__} runs under --autocast-dtype, which TorchScript cannot compile: export the "
        "model with --model-overrides \"{'autocast_dtype': 'none'}\""
    )


class AutocastForward:
    """Mixin for an encoder or decoder: ``forward`` runs in autocast when ``autocast_dtype`` is set.

    The decoder's ``(logits, extras)`` come back with float32 logits, whatever autocast computed them in.
    """

    autocast_dtype: torch.dtype | None = None

    def forward(self, *args, **kwargs):
        if self.autocast_dtype is None:
            return super().forward(*args, **kwargs)
        with torch.autocast(device_type=_device_type(self, args), dtype=self.autocast_dtype):
            out = super().forward(*args, **kwargs)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            out = (out[0].float(), *out[1:])  # the decoder's output logits
        return out

    def __prepare_scriptable__(self):
        if self.autocast_dtype is not None:
            _refuse_script(self)
        return super().__prepare_scriptable__() if hasattr(super(), "__prepare_scriptable__") else self


class Float32Forward:
    """Mixin for a numerically sensitive module: float32 inputs, autocast off inside ``forward``."""

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=_device_type(self, args), enabled=False):
            return super().forward(*_to_float32(args), **_to_float32(kwargs))

    def __prepare_scriptable__(self):
        _refuse_script(self)


def float32_module_types() -> tuple[type, ...]:
    """The module classes that always run in float32 under autocast (besides ``autocast_float32 = True``): those
    every axis choice declares in its ``float32``, whichever choices the model makes (a module runs in float32
    wherever it is built)."""
    declared = (item for table in declarations().values() for choice in table.values() for item in choice.float32)
    return tuple(dict.fromkeys(item for item in declared if isinstance(item, type)))


def _is_float32_module(module: nn.Module, types: tuple[type, ...]) -> bool:
    # apex's FusedLayerNorm (fairseq's LayerNorm on CUDA when apex is installed) is no nn.LayerNorm
    return (isinstance(module, types) or getattr(module, "autocast_float32", False)
            or type(module).__name__ == "FusedLayerNorm")  # fmt: skip


_SUBCLASSES: dict[tuple[type, type], type] = {}


def _mix_in(module: nn.Module, mixin: type) -> None:
    """Give ``module`` the behaviour of ``mixin`` by moving it to a subclass of its class (weights untouched)."""
    cls = type(module)
    if issubclass(cls, mixin):
        return
    if (mixin, cls) not in _SUBCLASSES:
        name = f"{mixin.__name__.removesuffix('Forward')}{cls.__name__}"
        _SUBCLASSES[mixin, cls] = type(name, (mixin, cls), {"__module__": cls.__module__, "__qualname__": name})
    module.__class__ = _SUBCLASSES[mixin, cls]


def enable_autocast(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """Run ``model.encoder`` and ``model.decoder`` in autocast with ``dtype`` (None: leave the model as is)."""
    if dtype is None:
        return model
    types = float32_module_types()
    for stack in (model.encoder, model.decoder):
        for module in stack.modules():
            if module is not stack and _is_float32_module(module, types):
                _mix_in(module, Float32Forward)
        _mix_in(stack, AutocastForward)
        stack.autocast_dtype = dtype
    return model


class AutocastModel:
    """Mixin for a fairseq model class (before ``TransformerModel`` in its bases): ``--autocast-dtype``."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_autocast_args(parser)

    @classmethod
    def build_model(cls, args, task):
        dtype = autocast_dtype(args)  # checked first: a clash stops before anything is built
        return enable_autocast(super().build_model(args, task), dtype)

