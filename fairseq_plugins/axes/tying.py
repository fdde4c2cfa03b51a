"""Axis ``--tying``: which weights adjacent layers share (Crossformer's hard guidance).

Crossformer ("Crossformer: Transformer with Alternated Cross-Layer Guidance", sections 2.1-2.2): pairs of
adjacent layers (t, t+1) share one projection, A(t) = B(t+1), one Parameter owned by layer t+1. The pairs, and
every interpretation of the paper they rest on, are in ``modules/cross_layer_guidance.py``:

    none         nothing shared
    key-query    W_K(t) = W_Q(t+1)                    (eq. 3)
    ffn          W2 at odd t, W1 at even t            (eq. 5)
    value        W_F at odd t, W_V at even t          (eq. 6)
    all          the three                            (Crossformer-All, table 2)

A choice ties the built model's layers (``tie(model, args)``) after the residual axis's initialisation, so a
tied pair keeps the upper layer's initialised weight whatever the residual choice's init multiplies. Soft
guidance (the regulariser of eq. 1-2, ``--guidance``/``--guidance-norm`` and the criterion
``label_smoothed_cross_entropy_with_guidance``) is not an axis choice: the composed model offers it to every
configuration (models/axes_transformer.py).
"""

from ..modules.cross_layer_guidance import BLOCKS, check_guidance, guided_blocks
from ..validation import PluginOptionError
from .choice import MATCHES, Choice, Speed


class Tying(Choice):
    axis = "tying"
    source = "Crossformer hard guidance (sections 2.1-2.2, eq. 3, 5, 6)"
    blocks: tuple[str, ...] = ()

    @classmethod
    def conflict(cls, other) -> str | None:
        if cls.blocks and other.axis == "residual" and other.name == "normformer" and "ffn" in cls.blocks:
            return ("NormFormer puts its LN_f inside fc2, so tying fc2 would share LN_f between the two layers too "
                    "(not Crossformer's eq. 5)")
        return None


class NoTying(Tying):
    name, source = "none", "no weights shared"
    paper, code, preset = "", "", None  # the default: every preset without tying
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), ()


class KeyQuery(Tying):
    """Crossformer's hard guidance; the other blocks are variants of it, declaring what differs."""

    name, blocks = "key-query", ("key-query",)
    # cited by its title, as modules/cross_layer_guidance.py does: no arXiv link or authors' code known here
    paper, code, preset = "Crossformer: Transformer with Alternated Cross-Layer Guidance", "", "crossformer_hg"
    # tied pairs follow the kept layers (models/crossformer.py records the original layer numbers)
    prunes = scripts = activation_checkpointing = double_backward = None
    float32, speed = (), (*MATCHES, Speed("memory", "<", 1.00))  # issue 15: tying saves memory


class FFN(KeyQuery):
    name, blocks, preset, speed = "ffn", ("ffn",), "crossformer_hg_ffn", ()


class Value(KeyQuery):
    name, blocks, preset, speed = "value", ("value",), "crossformer_hg_value", ()


class All(KeyQuery):
    name, blocks, preset, speed = "all", ("key-query", "ffn", "value"), "crossformer_all", ()


TYINGS: dict[str, type[Tying]] = {c.name: c for c in (NoTying, KeyQuery, FFN, Value, All)}


def check_tying(name: str, value) -> str:
    """A choice's name, or a comma list of distinct blocks; else PluginOptionError naming ``--tying``."""
    if value in TYINGS:
        return value
    try:
        return check_guidance(name, value)
    except PluginOptionError:
        raise PluginOptionError(
            f"--{name} must be one of {', '.join(TYINGS)}, or a comma list of distinct blocks from "
            f"{', '.join(BLOCKS)}; got {value!r}"
        ) from None


def combined_tying(value: str) -> type[Tying]:
    """A choice for a comma list of blocks (``key-query,ffn``), which Crossformer's presets accept."""
    name = check_guidance("tying", value)
    # a combination of blocks is a variant of Crossformer's hard guidance, as ``all`` is: All's capabilities
    return TYINGS.get(name) or type("CombinedTying", (All,), {"name": name, "blocks": guided_blocks(name),
                                                              "preset": None, "speed": ()})  # fmt: skip
