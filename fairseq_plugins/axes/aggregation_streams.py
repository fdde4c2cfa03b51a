"""The 2024-26 stream-carry ideas as ``--depth-aggregation`` choices (their entries join AGGREGATIONS).

    mhc        mHC (arXiv:2512.24880): n streams, H_res doubly stochastic by Sinkhorn       modules/mhc.py
    mhc-lite   mHC-lite (arXiv:2601.05732): H_res a convex combination of permutations     modules/mhc.py
    attnres    Full AttnRes (arXiv:2603.15031): softmax over all earlier sublayer outputs   modules/attn_res.py
    attnres-block  Block AttnRes: over block sums of S sublayers (--attnres-block-size)   modules/attn_res.py
    mudd       MUDDFormer (arXiv:2502.12170): Q/K/V/R ways from all earlier layer outputs  modules/muddformer.py
    frac       frac-connections (arXiv:2503.14125): HC's matrices across m fractions of C  modules/frac_connections.py

Like hyper-connections they own the carry between layers and their layers (Pre-LN sublayers on n streams):
``owns = {"stream", "layer"}``, so they refuse the other stream owners and every residual choice but ``pre``.
"""

from ..modules.mhc import BIAS_INITS
from ..validation import PluginOptionError, argparse_type, check_choice, check_int
from . import set_defaults
from .aggregation import Aggregation

MAX_RATE = 16


class MHC(Aggregation):
    name, source = "mhc", "mHC (Xie et al., DeepSeek, arXiv:2512.24880)"
    owns, own_layers = frozenset({"stream", "layer"}), True
    residual = "sinkhorn"
    max_rate = MAX_RATE

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument(
            "--mhc-rate", type=argparse_type(check_int, "mhc_rate", 1, MAX_RATE), metavar="N",
            help=f"mHC/mHC-lite: streams per token n (default 4, the paper's; mhc-lite needs n! coefficients: "
            f"n <= 5); 1 <= N <= {MAX_RATE}",
        )  # fmt: skip
        parser.add_argument(
            "--mhc-bias-init", type=argparse_type(check_choice, "mhc_bias_init", BIAS_INITS), metavar="INIT",
            help="mHC's static biases b at init (the paper states none): preln (default: HC's init through mHC's "
            "constraints, every stream equals the Pre-LN state at init) or mhc_lite (the FFTYYY/mhc-lite code's)",
        )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        set_defaults(args, {"mhc_rate": 4, "mhc_bias_init": "preln"})

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        args.mhc_rate = check_int("mhc_rate", args.mhc_rate, 1, cls.max_rate)
        args.mhc_bias_init = check_choice("mhc_bias_init", args.mhc_bias_init, BIAS_INITS)

    @classmethod
    def options(cls, args) -> dict:
        return {"residual": cls.residual, "bias_init": args.mhc_bias_init}

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        from ..models.mhc_transformer import MHCDecoder, MHCEncoder

        return MHCEncoder, MHCDecoder

    @classmethod
    def stack_args(cls, args) -> tuple:
        return args.mhc_rate, cls.options(args)


class MHCLite(MHC):
    name, source = "mhc-lite", "mHC-lite (Yang & Gao, arXiv:2601.05732)"
    residual, max_rate = "permutations", 5

    @classmethod
    def check(cls, args) -> None:
        if args.mhc_rate is not None and not 1 <= int(args.mhc_rate) <= 5:
            raise PluginOptionError(
                f"--mhc-rate must be in [1, 5] with {cls.label()}: H_res mixes the n! permutation matrices, got "
                f"{args.mhc_rate}"
            )
        super().check(args)


FRAC_MODES = ("dynamic", "static")


class Frac(Aggregation):
    name, source = "frac", "frac-connections (Zhu et al., arXiv:2503.14125)"
    owns, own_layers = frozenset({"stream", "layer"}), True

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument(
            "--frac-rate", type=argparse_type(check_int, "frac_rate", 1, 64), metavar="M",
            help="frac-connections: fractions m of the C-wide state, must divide the embedding width (default 2; "
            "the paper runs m = 2 and 4); 1 <= M <= 64",
        )  # fmt: skip
        parser.add_argument(
            "--frac-mode", type=argparse_type(check_choice, "frac_mode", FRAC_MODES), metavar="MODE",
            help="dynamic (default, eq. 11-14) or static (eq. 8) frac-connections",
        )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        set_defaults(args, {"frac_rate": 2, "frac_mode": "dynamic"})

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        args.frac_rate = check_int("frac_rate", args.frac_rate, 1, 64)
        args.frac_mode = check_choice("frac_mode", args.frac_mode, FRAC_MODES)
        for side in ("encoder", "decoder"):
            width = getattr(args, f"{side}_embed_dim")
            if width % args.frac_rate:
                raise PluginOptionError(
                    f"--frac-rate {args.frac_rate} must divide --{side}-embed-dim {width} (m fractions of C)"
                )

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        from ..models.mhc_transformer import FracDecoder, FracEncoder

        return FracEncoder, FracDecoder

    @classmethod
    def stack_args(cls, args) -> tuple:
        return args.frac_rate, args.frac_mode == "dynamic"


class AttnRes(Aggregation):
    name, source = "attnres", "Attention Residuals, Full (Kimi Team, arXiv:2603.15031)"
    owns, own_layers = frozenset({"stream", "layer"}), True

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument(
            "--attnres-block-size", type=argparse_type(check_int, "attnres_block_size", 1, 10_000), metavar="S",
            help="Block AttnRes: sublayers per block S (default 6, the paper's Kimi Linear setting and a multiple "
            "of the encoder's 2 and the decoder's 3 sublayers per layer; the paper found S = 2-8 equally good); "
            "S >= 1, only with --depth-aggregation attnres-block",
        )  # fmt: skip

    @classmethod
    def defaults(cls, args) -> None:
        set_defaults(args, {"attnres_block_size": 1 if cls.name == "attnres" else 6})

    @classmethod
    def check(cls, args) -> None:
        super().check(args)
        args.attnres_block_size = check_int("attnres_block_size", args.attnres_block_size, 1, 10_000)
        if cls.name == "attnres" and args.attnres_block_size != 1:
            raise PluginOptionError(
                "--attnres-block-size must be 1 with --depth-aggregation attnres (Full AttnRes); use "
                "--depth-aggregation attnres-block for blocks"
            )

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        from ..models.mhc_transformer import AttnResDecoder, AttnResEncoder

        return AttnResEncoder, AttnResDecoder

    @classmethod
    def stack_args(cls, args) -> tuple:
        return (args.attnres_block_size,)


class AttnResBlock(AttnRes):
    name, source = "attnres-block", "Attention Residuals, Block (Kimi Team, arXiv:2603.15031, eq. 5-6)"


class MUDD(Aggregation):
    name, source = "mudd", "MUDDFormer (Xiao et al., arXiv:2502.12170)"
    owns, own_layers = frozenset({"stream", "layer"}), True

    @classmethod
    def stacks(cls) -> tuple[type, type]:
        from ..models.mudd_transformer import MUDDDecoder, MUDDEncoder

        return MUDDEncoder, MUDDDecoder


STREAM_AGGREGATIONS = (MHC, MHCLite, AttnRes, AttnResBlock, Frac, MUDD)
