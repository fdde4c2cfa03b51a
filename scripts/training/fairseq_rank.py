#!/usr/bin/env python
"""fairseq-train as one rank of a torchrun launch (train_recipe.py starts it; so do the distributed tests).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK for each process it starts. fairseq's own detection of them
(``fairseq.distributed.utils._infer_torch_distributed_launch_init``, fairseq 0.12.3) divides the rank by the
CUDA device count, which fails on CPU, and is skipped altogether when ``--distributed-world-size`` keeps its
CPU default of 1. So this passes them explicitly, as ``--distributed-init-method env:// --distributed-rank
RANK --device-id LOCAL_RANK --distributed-no-spawn``, and refuses a world size that differs from the one the
command was planned for (that would change the tokens per update).

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m scripts.training.fairseq_rank DATA ...
"""

import gc
import os
import sys


def rank_arguments(argv: list[str], env) -> list[str]:
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in env]
    if missing:
        raise SystemExit(f"[fairseq_rank] error: {', '.join(missing)} not set: start this with torchrun")
    world = env["WORLD_SIZE"]
    planned = argv[len(argv) - 1 - argv[::-1].index("--distributed-world-size") + 1] if "--distributed-world-size" in argv else None
    if planned != world:
        raise SystemExit(f"[fairseq_rank] error: torchrun started WORLD_SIZE={world} processes but the command was "
                         f"planned for --distributed-world-size {planned}: the tokens per update would change")  # fmt: skip
    return [*argv, "--distributed-init-method", "env://", "--distributed-rank", env["RANK"],
            "--device-id", env["LOCAL_RANK"], "--distributed-no-spawn"]  # fmt: skip


def main() -> None:
    sys.argv = [sys.argv[0], *rank_arguments(sys.argv[1:], os.environ)]
    import torch.distributed as dist
    from fairseq_cli.train import cli_main

    cli_main()
    # fairseq leaves its process group alive: at interpreter exit Gloo's worker threads can then abort a rank whose
    # training has finished (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#190489), and
    # torchrun reports the launch failed. Only after a successful run: a rank that raised must not wait on the others.
    if dist.is_available() and dist.is_initialized():
        # fairseq's DDP wrapper, left in reference cycles, freed first: freed after the group, its reducer holds the
        # group's last reference, and the group's destructor runs with the GIL held and joins a Gloo thread that may
        # be waiting for the GIL to free a tensor, a deadlock (pytorch/pytorch#56297; tests/test_grn_kernel_modes.py)
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
