"""How the benchmark times, counts and weighs one model: training steps and beam decoding (wall-clock and process
CPU seconds), peak memory of a training step, FLOPs, the matmul peak, per-operator profiles, and the
round-by-round ratios. On CUDA every timing ends with torch.cuda.synchronize (kernels run asynchronously)."""

import gc
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from fairseq import utils
from fairseq.logging import metrics
from torch.utils.flop_counter import FlopCounterMode

from scripts.benchmark.bench_data import Batches
from scripts.benchmark.bench_families import Contender


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def on_device(samples: Sequence[dict], device: str) -> list[dict]:
    """Decoding batches on the model's device (fairseq-generate moves each batch; the trainer does it itself)."""
    return [utils.move_to_cuda(s) for s in samples] if device == "cuda" else list(samples)


def largest_batch(batches: Batches) -> dict:
    return max(batches.train, key=lambda s: s["net_input"]["src_tokens"].numel() + s["target"].numel())


def settle() -> None:
    """Collect the garbage of the last measurement, then freeze what survives: no collection of
    long-lived objects lands inside the next timing, and this one only walks the last step's objects."""
    gc.collect()
    gc.freeze()


def train_once(c: Contender, samples: Sequence[dict]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds for one training step on each sample."""
    settle()
    with metrics.aggregate(new_root=True):
        start, cpu = time.perf_counter(), time.process_time()
        for sample in samples:
            c.trainer.train_step([sample])
        synchronize(c.device)
        return time.perf_counter() - start, time.process_time() - cpu


def decode_once(c: Contender, samples: Sequence[dict], decode_len: int) -> tuple[float, float]:
    """Wall-clock and process CPU seconds to beam-decode every sample; checks that every hypothesis has the
    forced length."""
    settle()
    start, cpu = time.perf_counter(), time.process_time()
    outputs = [c.task.inference_step(c.generator, [c.decode_model], s) for s in on_device(samples, c.device)]
    synchronize(c.device)
    seconds = time.perf_counter() - start, time.process_time() - cpu
    lengths = {len(h["tokens"]) for out in outputs for hyps in out for h in hyps}
    if lengths != {decode_len + 1}:
        raise RuntimeError(f"{c.arch}: decoded lengths {sorted(lengths)}, expected {decode_len + 1}")
    return seconds


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_train_memory(c: Contender, sample: dict) -> dict:
    """Bytes live at the peak of one training step (see benchmark.py's docstring), by part: parameters and
    optimizer state, plus the most the step itself held at once (CPU: replayed from torch.profiler's
    allocation events; CUDA: torch.cuda.max_memory_allocated over the step, less what was allocated before it,
    so the other models of the line-up, resident on the same GPU, do not count)."""
    c.trainer.zero_grad()  # the previous step's gradients go now: the profiled step allocates its own
    settle()
    params = list(c.trainer.model.parameters())
    optimizer = getattr(c.trainer.optimizer, "fp32_optimizer", c.trainer.optimizer)  # fp16: the fp32 master copy
    state = [v for s in optimizer.optimizer.state.values() for v in s.values()]
    master = [p for group in optimizer.optimizer.param_groups for p in group["params"]] if optimizer is not c.trainer.optimizer else []
    persistent = _storage_bytes(params) + _storage_bytes(state) + _storage_bytes(master)
    peak = cuda_step_peak(c, sample) if c.device == "cuda" else cpu_step_peak(c, sample)
    return {"peak_bytes": persistent + peak, "parameters_and_optimizer_bytes": persistent, "step_bytes": peak}


def cuda_step_peak(c: Contender, sample: dict) -> int:
    synchronize(c.device)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    # fairseq's trainer reads and resets the peak inside train_step when it has a cuda_env (its gb_free metric)
    cuda_env, c.trainer.cuda_env = c.trainer.cuda_env, None
    try:
        with metrics.aggregate(new_root=True):
            c.trainer.train_step([sample])
    finally:
        c.trainer.cuda_env = cuda_env
    synchronize(c.device)
    return torch.cuda.max_memory_allocated() - before


def cpu_step_peak(c: Contender, sample: dict) -> int:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, metrics.aggregate(new_root=True):
        c.trainer.train_step([sample])
    events = []  # (time, address, bytes allocated (+) or freed (-))
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    # replay the step's own blocks only: the allocator's running total (total_allocated) is process-wide and
    # remembers blocks of earlier profiled steps, so a free of an older block would read as a spurious dip
    live: dict[int, int] = {}
    running = peak = 0
    for _, ptr, size in sorted(events):
        if size > 0:
            live[ptr] = size
            running += size
            peak = max(peak, running)
        elif ptr in live:
            running -= live.pop(ptr)
    return peak


def counted_train_flops(c: Contender, sample: dict) -> int:
    """Matmul FLOPs of one real training step, as torch's FlopCounterMode counts them."""
    counter = FlopCounterMode(display=False)
    with counter, metrics.aggregate(new_root=True):
        c.trainer.train_step([sample])
    return counter.get_total_flops()


def model_train_flops(sample: dict, d: int, f: int, layers: tuple[int, int], vocab: int) -> float:
    """Model FLOPs of one training step by the formula of the module docstring."""
    enc, dec = layers
    b, s = sample["net_input"]["src_tokens"].shape
    if "prev_output_tokens" not in sample["net_input"]:  # a language model's blocks: self-attention layers only
        forward = 2 * b * s * (dec * (4 * d * d + 2 * d * f) + d * vocab) + 4 * d * b * dec * s * s
        return 3.0 * forward
    t = sample["net_input"]["prev_output_tokens"].shape[1]
    forward = 2 * (b * s * (enc * (4 * d * d + 2 * d * f) + dec * 2 * d * d) + b * t * (dec * (6 * d * d + 2 * d * f) + d * vocab))
    forward += 4 * d * b * (enc * s * s + dec * (t * t + t * s))
    return 3.0 * forward


def matmul_peak(repeats: int, n: int = 2048, device: str = "cpu") -> float:
    """Best float32 matmul FLOP/s of repeats timings of an n x n x n product, on the current threads (CPU) or
    the GPU (with TF32 as torch's matmul precision setting leaves it)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)  # warm-up
    best = min(_timed(lambda: torch.mm(a, b), device) for _ in range(repeats))
    return 2.0 * n**3 / best


def _timed(fn: Callable[[], object], device: str = "cpu") -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------- the run


def spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratios(base_s: Sequence[float], s: Sequence[float], base_cpu_s: Sequence[float], cpu_s: Sequence[float]) -> dict:
    """Speed ratios to the baseline (time ratios base/model), round by round: median, min, max of the
    wall-clock ones; ``best``, the ratio of the best wall-clock times (noise only ever adds time); ``cpu``,
    the median ratio of process CPU times, which time spent descheduled by other load does not inflate
    (with one thread; with more, OpenMP's spinning threads count too, so it is less telling)."""
    per_round_cpu = [b / t for b, t in zip(base_cpu_s, cpu_s, strict=True)]
    return spread([b / t for b, t in zip(base_s, s, strict=True)]) | {
        "best": min(base_s) / min(s), "cpu": statistics.median(per_round_cpu)}  # fmt: skip


def op_times(fn: Callable[[], object]) -> dict[str, tuple[float, int]]:
    """{operator: (self CPU milliseconds, calls)} of one call of fn, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    settle()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: (e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()}


def best_op_times(fns: Sequence[Callable[[], object]], repeats: int) -> list[dict[str, tuple[float, int]]]:
    """op_times of each fn, profiled ``repeats`` times interleaved; per operator the least time seen
    (load from other processes only ever adds time; the call counts do not change)."""
    runs = [[op_times(fn) for fn in fns] for _ in range(repeats)]
    best = []
    for i in range(len(fns)):
        names = set().union(*(run[i] for run in runs))
        best.append({n: (min(run[i].get(n, (0.0, 0))[0] for run in runs), runs[0][i].get(n, (0.0, 0))[1])
                     for n in names})  # fmt: skip
    return best
