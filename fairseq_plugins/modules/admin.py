"""Admin (Liu et al., "Understanding the Difficulty of Training Transformers", EMNLP 2020,
arXiv:2004.08249, its "Admin" section; section number not checked), Post-LN with a profiled residual
scale per sublayer:

    x_i = LN(omega_i * x_{i-1} + F_i(x_{i-1}))            omega_i a d-vector, learned

The paper sets omega_i from one profiling forward pass with the default initialization,
omega_i = sqrt(sum_{j<i} Var[F_j(x_{j-1})]), and trains from that same initialization. The authors' code
(Transformer-Clinic, ``--init-type adaptive-profiling`` then ``adaptive``), which this follows:

    r = 1                                   separately for the encoder and the decoder
    for each sublayer i in order (decoder: self-attention, cross-attention, FFN):
        omega_i := r                        filled in before the sublayer's sum, so the pass uses it
        r := sqrt(Var(omega_i * x_{i-1}) + Var(F_i(x_{i-1})))

Var is the population variance over every element of the (time, batch, d) tensor, padding included,
F_i's output taken after dropout, the pass in training mode (dropout on), as the authors' single
training step did. So omega_1 = 1 and the embedding's variance stands in for the empty sum.

Differences from the authors' two runs, none of which changes the numbers above:
- the profiling pass runs automatically, on the first batch of training, as an extra no-grad forward
  before that batch's real one (``AdminTransformerModel.forward``); a buffer ``admin_profiled`` in the
  model's state_dict records it, so resuming from a checkpoint never profiles again, and
  ``profile_admin(...)`` does it by hand. Under data parallelism every rank then takes rank 0's omegas
  (as DDP starts every replica from rank 0's parameters), so the replicas agree and a 2-rank run equals
  a single-process run with ``--update-freq 2``, whose first batch is rank 0's;
- omega = omega_init + omega_delta: the profiled value is a buffer, the learned part a Parameter that
  starts at 0. Its gradient is omega's, so Adam (without weight decay) follows the same path as with
  omega itself learned; and fp16 optimizers, whose float32 master copies are made before the first
  batch, never hold a stale omega. (Weight decay pulls omega toward its profiled value, not toward 0.)
- FFN weights start as xavier_uniform with zero bias (the authors' Linear); fairseq's are PyTorch's.

Not done: admin-torch's profiling-free O(log n) rule omega = sqrt((n+1)/ln(n+1) - 1).
"""

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .residual_wiring import (
    DECODER_SITES,
    ENCODER_SITES,
    SiteDecoderLayer,
    SiteEncoderLayer,
)


class AdminProfile:
    """The running scalar r of one stack during the profiling pass."""

    def __init__(self):
        self.r = 1.0


def population_variance(x: Tensor) -> float:
    return float(x.detach().double().var(correction=0))


class _AdminResidual:
    """Mixin for a ``SiteResidual`` layer: omega per sublayer, and the profiling step of each sum."""

    def _init_admin(self, sites: tuple[str, ...]) -> None:
        self.admin_sites = sites
        self.register_buffer("omega_init", torch.ones(len(sites), self.embed_dim))
        self.omega_delta = nn.Parameter(torch.zeros(len(sites), self.embed_dim))
        self.admin_profile: AdminProfile | None = None

    def omega(self, site: str) -> Tensor:
        i = self.admin_sites.index(site)
        return self.omega_init[i] + self.omega_delta[i]

    def combine(self, site, x, residual):
        profile = self.admin_profile
        if profile is not None:
            with torch.no_grad():
                self.omega_init[self.admin_sites.index(site)].fill_(profile.r)
        skip = residual * self.omega(site)
        if profile is not None:
            profile.r = (population_variance(skip) + population_variance(x)) ** 0.5
        return skip + x


class AdminEncoderLayer(_AdminResidual, SiteEncoderLayer):
    """fairseq's Post-LN encoder layer with x_i = LN(omega_i * x_{i-1} + F_i(x_{i-1}))."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self._init_admin(ENCODER_SITES)


class AdminDecoderLayer(_AdminResidual, SiteDecoderLayer):
    """fairseq's Post-LN decoder layer with omega on its self-attention, cross-attention and FFN."""

    def __init__(self, cfg, no_encoder_attn: bool):
        super().__init__(cfg, no_encoder_attn)
        self._init_admin(DECODER_SITES if self.encoder_attn is not None else ("self_attn", "ffn"))


@torch.no_grad()
def profile_(encoder_layers, decoder_layers, forward) -> None:
    """Run ``forward()`` once with profiling on (fills every omega_init), then take rank 0's values."""
    stacks = [(list(encoder_layers), AdminProfile()), (list(decoder_layers), AdminProfile())]
    for layers, profile in stacks:
        for layer in layers:
            layer.admin_profile = profile
    try:
        # the profiling reads each variance on the host (a float per sublayer): eager even where the layers are
        # compiled (torch.compile would break the graph at every read; it runs once)
        with torch.compiler.set_stance("force_eager"):
            forward()
    finally:
        for layers, _ in stacks:
            for layer in layers:
                layer.admin_profile = None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for layers, _ in stacks:
            for layer in layers:
                dist.broadcast(layer.omega_init, src=0)
