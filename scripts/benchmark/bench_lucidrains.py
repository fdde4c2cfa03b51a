"""The project's hyper-connection modules against lucidrains' ``hyper-connections`` package (PyPI
``hyper-connections``, import ``hyper_connections``) at equal shapes (issue 58, item 3: keep the project at least
twice as fast).

One block stack, built several ways with the same sublayers (Pre-LN attention and FFN: LayerNorm, causal
multi-head attention via scaled_dot_product_attention, GELU FFN; the same width, depth, heads and tokens):

- ``preln``: the baseline, x + T(x) per sublayer, a final LayerNorm;
- ``hc_static``, ``hc_dynamic``, ``mhc``, ``mhc_lite``: the project's modules (modules/hyper_connections.py,
  modules/mhc.py) over n streams, read out as the sum of the streams, then the final LayerNorm;
- ``lucidrains_hc``, ``lucidrains_mhc``: the package's ``HyperConnections`` (static + dynamic, its only form) and
  ``ManifoldConstrainedHyperConnections`` (20 Sinkhorn iterations, as the project's mHC), with its own expand
  and reduce functions: present only when the package is installed; otherwise the report says so and
  measures the project's side.

Two measurements, each in process CPU seconds (time lost to other processes on a loaded machine does not count;
run with one thread): ``train``, forward and backward of the stack (a summed output as the loss) over
``--batch`` x ``--seq-len`` tokens; ``decode``, forward without autograd of one new token per sequence over
``--decode-batch`` sequences (beams x sentences) attending to a cached ``--decode-context`` tokens per
layer, the step of incremental decoding. Every round measures every stack once, in rotating order; ratios are
per round (Pre-LN's CPU time / the stack's, so 0.5 = half the speed of Pre-LN), reported as the median with
the min-max over rounds, and the project-to-lucidrains ratio per round likewise (mHC vs mHC, dynamic HC vs HC).

Run: ``OMP_NUM_THREADS=1 python -m scripts.benchmark.bench_lucidrains --json docs/bench_lucidrains.json
--markdown docs/bench_lucidrains.md``. ``--profile`` adds, per stack and measurement, the operators whose
self CPU time differs most from Pre-LN's (torch.profiler, least time of ``--profile-repeats`` runs).
"""

import argparse
import contextlib
import importlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_plugins.modules.hyper_connections import HyperConnection
from fairseq_plugins.modules.mhc import (
    ManifoldHyperConnection,
    collapse_streams,
    expand_streams,
)
from scripts.benchmark.bench_timing import best_op_times, settle, spread
from scripts.recipe_common import write_json, write_text

PACKAGE = "hyper_connections"
PROJECT = ("hc_static", "hc_dynamic", "mhc", "mhc_lite")
LUCIDRAINS = ("lucidrains_hc", "lucidrains_mhc")
# the project's module each lucidrains module is compared with: the same maths (HC: static + dynamic)
PAIRS = {"lucidrains_mhc": "mhc", "lucidrains_hc": "hc_dynamic"}
MEASUREMENTS = ("train", "decode")


def lucidrains_package():
    """The ``hyper_connections`` module, or None when it is not installed."""
    try:
        return importlib.import_module(PACKAGE)
    except ImportError:
        return None


# ------------------------------------------------------------------------------------------- the sublayers


class Attention(nn.Module):
    """Causal multi-head self-attention, batch first (batch, time, d); in decoding, the new tokens attend to a
    fixed cache of earlier keys and values (``cache``) as incremental decoding's step does."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.cache is not None:
            k, v = torch.cat([self.cache[0], k], 2), torch.cat([self.cache[1], v], 2)
            out = F.scaled_dot_product_attention(q, k, v)  # one new token: it sees the whole cache
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(out.transpose(1, 2).reshape(b, t, d))


class Sublayer(nn.Module):
    """T(h) = F(LN(h)), the Pre-LN sublayer: the same module under every residual connection."""

    def __init__(self, d: int, inner: nn.Module):
        super().__init__()
        self.norm, self.inner = nn.LayerNorm(d), inner

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner(self.norm(h))


def sublayers(d: int, ffn: int, heads: int, layers: int) -> nn.ModuleList:
    subs = []
    for _ in range(layers):
        subs.append(Sublayer(d, Attention(d, heads)))
        subs.append(Sublayer(d, nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))))
    return nn.ModuleList(subs)


# ------------------------------------------------------------------------------------------- the stacks


class Stack(nn.Module):
    """The block stack under one kind of residual connection; input and output (batch, time, d)."""

    def __init__(self, kind: str, d: int, ffn: int, heads: int, layers: int, n: int, package=None):
        super().__init__()
        self.kind, self.n = kind, n
        self.subs = sublayers(d, ffn, heads, layers)
        self.final_norm = nn.LayerNorm(d)
        sites = range(len(self.subs))
        if kind in ("hc_static", "hc_dynamic"):
            self.conns = nn.ModuleList(HyperConnection(d, n, k, dynamic=kind == "hc_dynamic") for k in sites)
        elif kind in ("mhc", "mhc_lite"):
            residual = "sinkhorn" if kind == "mhc" else "permutations"
            self.conns = nn.ModuleList(ManifoldHyperConnection(d, n, k, residual=residual) for k in sites)
        elif kind in LUCIDRAINS:
            module = package.manifold_constrained_hyper_connections if kind == "lucidrains_mhc" else package.hyper_connections
            init, self.expand, self.reduce = module.get_init_and_expand_reduce_stream_functions(n, dim=d)
            self.conns = nn.ModuleList(init(layer_index=k) for k in sites)
        elif kind != "preln":
            raise ValueError(f"unknown stack {kind!r}")

    def attentions(self):
        return [s.inner for s in self.subs if isinstance(s.inner, Attention)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "preln":
            for sub in self.subs:
                x = x + sub(x)
            return self.final_norm(x)
        if self.kind in LUCIDRAINS:
            streams = self.expand(x)  # (batch n, time, d)
            for conn, sub in zip(self.conns, self.subs, strict=True):
                branch_input, add_residual = conn(streams)
                streams = add_residual(sub(branch_input))
            return self.final_norm(self.reduce(streams))
        streams = expand_streams(x, self.n)  # (batch, time, n, d)
        for conn, sub in zip(self.conns, self.subs, strict=True):
            streams = conn(streams, sub)
        return collapse_streams(streams, self.final_norm)


# ------------------------------------------------------------------------------------------- the measurements


class Case:
    """One stack with its inputs: a training step and a decoding step, each timed in process CPU seconds."""

    def __init__(self, kind: str, opts, package):
        torch.manual_seed(0)
        self.kind = kind
        self.stack = Stack(kind, opts.width, opts.ffn_dim, opts.heads, opts.layers, opts.streams, package)
        g = torch.Generator().manual_seed(1)
        self.train_x = torch.randn(opts.batch, opts.seq_len, opts.width, generator=g)
        self.decode_x = torch.randn(opts.decode_batch, 1, opts.width, generator=g)
        hd = opts.width // opts.heads
        shape = (opts.decode_batch, opts.heads, opts.decode_context, hd)
        self.caches = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g))
                       for _ in self.stack.attentions()]  # fmt: skip
        self.steps = {"train": opts.train_steps, "decode": opts.decode_steps}

    def train_step(self) -> None:
        for a in self.stack.attentions():
            a.cache = None
        self.stack.zero_grad(set_to_none=True)
        self.stack(self.train_x).sum().backward()

    def decode_step(self) -> None:
        for a, cache in zip(self.stack.attentions(), self.caches, strict=True):
            a.cache = cache
        with torch.no_grad():
            self.stack(self.decode_x)

    def step(self, measurement: str):
        return self.train_step if measurement == "train" else self.decode_step

    def timed(self, measurement: str) -> float:
        """Process CPU seconds of ``steps`` steps."""
        step = self.step(measurement)
        settle()
        start = time.process_time()
        for _ in range(self.steps[measurement]):
            step()
        return time.process_time() - start


def measure(cases: list[Case], rounds: int, log) -> dict[str, dict[str, list[float]]]:
    """{measurement: {kind: CPU seconds per round}}: every round runs every case once, in rotating order."""
    seconds = {m: {c.kind: [] for c in cases} for m in MEASUREMENTS}
    for c in cases:  # warm-up: first-touch allocations, the kernels' first calls, lazy initialisation
        for m in MEASUREMENTS:
            c.step(m)()
    for r in range(rounds):
        order = cases[r % len(cases):] + cases[: r % len(cases)]
        for m in MEASUREMENTS:
            for c in order:
                seconds[m][c.kind].append(c.timed(m))
        log(f"round {r + 1}/{rounds} done")
    return seconds


def per_round(base: list[float], other: list[float]) -> dict:
    """The per-round ratios base / other (other's speed relative to base): median, min, max."""
    return spread([b / o for b, o in zip(base, other, strict=True)])


def profile_deltas(cases: list[Case], repeats: int, top: int) -> dict:
    """Per stack and measurement, the ``top`` operators whose self CPU time (ms, least of ``repeats`` runs)
    differs most from Pre-LN's, with their call counts."""
    out: dict = {}
    for m in MEASUREMENTS:
        times = best_op_times([c.step(m) for c in cases], repeats)
        base = times[0]
        for c, t in zip(cases[1:], times[1:], strict=True):
            names = set(base) | set(t)
            rows = [{"op": n, "ms": round(t.get(n, (0.0, 0))[0], 3), "baseline_ms": round(base.get(n, (0.0, 0))[0], 3),
                     "calls": t.get(n, (0.0, 0))[1], "baseline_calls": base.get(n, (0.0, 0))[1]}
                    for n in names]  # fmt: skip
            rows.sort(key=lambda r: -abs(r["ms"] - r["baseline_ms"]))
            total = sum(v[0] for v in t.values()) - sum(v[0] for v in base.values())
            out.setdefault(c.kind, {})[m] = {"extra_ms": round(total, 3), "ops": rows[:top]}
    return out


# ------------------------------------------------------------------------------------------- the report


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu} ({os.cpu_count()} CPUs), {torch.get_num_threads()} thread(s), torch {torch.__version__}"


def report(opts, package, seconds: dict, load: tuple, elapsed: float, profiles: dict) -> dict:
    kinds = list(seconds["train"])
    rows = {}
    for kind in kinds:
        rows[kind] = {m: {"ratio_to_preln": per_round(seconds[m]["preln"], seconds[m][kind]),
                          "ms_per_step": 1e3 * statistics.median(seconds[m][kind]) / getattr(opts, f"{m}_steps")}
                      for m in MEASUREMENTS}  # fmt: skip
    versus = {}
    for theirs, ours in PAIRS.items():
        if theirs in seconds["train"]:
            versus[f"{ours} / {theirs}"] = {m: per_round(seconds[m][theirs], seconds[m][ours]) for m in MEASUREMENTS}
    version = getattr(package, "__version__", None) if package else None
    if package and version is None:
        with contextlib.suppress(Exception):
            from importlib.metadata import version as dist_version

            version = dist_version("hyper-connections")
    return {
        "command": "OMP_NUM_THREADS=1 python -m scripts.benchmark.bench_lucidrains " + shlex.join(opts.argv),
        "machine": machine(),
        "load_average_before_after": [round(v, 2) for v in load],
        "seconds": round(elapsed, 1),
        "lucidrains": ({"installed": True, "version": version} if package else
                       {"installed": False, "note": f"{PACKAGE} (PyPI hyper-connections) is not installed: only the "
                                                    "project's modules were measured"}),
        "shape": {"width": opts.width, "ffn_dim": opts.ffn_dim, "heads": opts.heads, "layers": opts.layers,
                  "streams": opts.streams, "train_tokens": [opts.batch, opts.seq_len],
                  "decode_tokens": opts.decode_batch, "decode_context": opts.decode_context},
        "rounds": opts.rounds,
        "steps": {"train": opts.train_steps, "decode": opts.decode_steps},
        "stacks": rows,
        "project_over_lucidrains": versus,
        "profiles": profiles,
    }


def fmt(r: dict) -> str:
    return f"**{r['median']:.2f}** ({r['min']:.2f}-{r['max']:.2f})"


def markdown(rep: dict) -> str:
    s = rep["shape"]
    lines = [  # no title: a tool's table, as benchmark.md (the README links topic pages, those with one)
        "The project's hyper-connection modules against lucidrains' `hyper-connections` package at equal shapes.",
        "",
        (f"Made by `{rep['command']}` on {rep['machine']} in {rep['seconds']:.0f} s (load average "
        f"{rep['load_average_before_after'][0]} before, {rep['load_average_before_after'][1]} after: a shared machine; "
        "the ratios are of process CPU times, per round)."),
        "",
        (f"Block stack: {s['layers']} layers (attention + FFN sublayers, Pre-LN), width {s['width']}, FFN {s['ffn_dim']}, "
        f"{s['heads']} heads, n = {s['streams']} streams; training: forward + backward over {s['train_tokens'][0]} x "
        f"{s['train_tokens'][1]} tokens; decoding: forward without autograd of {s['decode_tokens']} new tokens "
        f"attending to {s['decode_context']} cached ones. Median ratio to Pre-LN over {rep['rounds']} interleaved "
        "rounds (min-max)."),
        "",
    ]
    lucid = rep["lucidrains"]
    if not lucid["installed"]:
        lines += [f"lucidrains' package: {lucid['note']}.", ""]
    else:
        lines += [f"lucidrains' package: hyper-connections {lucid['version']}.", ""]
    lines += ["| stack | train ratio | decode ratio | train ms/step | decode ms/step |", "|---|---:|---:|---:|---:|"]
    for kind, row in rep["stacks"].items():
        t, d = row["train"], row["decode"]
        lines.append(f"| `{kind}` | {fmt(t['ratio_to_preln'])} | {fmt(d['ratio_to_preln'])} | "
                     f"{t['ms_per_step']:.1f} | {d['ms_per_step']:.2f} |")  # fmt: skip
    if rep["project_over_lucidrains"]:
        lines += ["", "The project's module over lucidrains' (speed ratio, per round; target >= 2):", "",
                  "| pair | train | decode |", "|---|---:|---:|"]  # fmt: skip
        for pair, r in rep["project_over_lucidrains"].items():
            lines.append(f"| {pair} | {fmt(r['train'])} | {fmt(r['decode'])} |")
    for kind, per in rep["profiles"].items():
        for m, p in per.items():
            # direct calls of the fused C kernels are no operators, and the interpreter between operators is
            # none either: the profile sees neither, the timed step does
            step = rep["stacks"][kind][m]["ms_per_step"] - rep["stacks"]["preln"][m]["ms_per_step"]
            lines += ["", (f"Profile, `{kind}` {m} (self CPU ms against Pre-LN, one step: the operators +{p['extra_ms']:.1f} ms; "
                          f"the timed step +{step:.1f} ms; direct kernel calls and the Python between operators are no operators):"),
                      "", "| operator | ms | Pre-LN ms | calls | Pre-LN calls |", "|---|---:|---:|---:|---:|"]  # fmt: skip
            for o in p["ops"]:
                lines.append(f"| `{o['op']}` | {o['ms']:.2f} | {o['baseline_ms']:.2f} | {o['calls']} | {o['baseline_calls']} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- the command line


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_lucidrains.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--width", type=positive, default=256)
    p.add_argument("--ffn-dim", type=positive, default=1024)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--layers", type=positive, default=12, help="blocks (each an attention and an FFN sublayer)")
    p.add_argument("--streams", type=positive, default=4, help="n, the streams of every hyper-connection")
    p.add_argument("--batch", type=positive, default=8, help="training sequences")
    p.add_argument("--seq-len", type=positive, default=64, help="training tokens per sequence")
    p.add_argument("--decode-batch", type=positive, default=80, help="decoded sequences (beams x sentences)")
    p.add_argument("--decode-context", type=positive, default=16, help="cached tokens each new token attends to")
    p.add_argument("--train-steps", type=positive, default=2, help="training steps per timing")
    p.add_argument("--decode-steps", type=positive, default=16, help="decoding steps per timing")
    p.add_argument("--rounds", type=positive, default=5)
    p.add_argument("--threads", type=positive, default=1, help="torch threads (default 1: CPU time is only telling with one)")
    p.add_argument("--stack", action="append", choices=("preln", *PROJECT, *LUCIDRAINS),
                   help="measure only these (repeatable; Pre-LN always)")  # fmt: skip
    p.add_argument("--profile", action="store_true", help="profile every stack against Pre-LN")
    p.add_argument("--profile-repeats", type=positive, default=3)
    p.add_argument("--profile-top", type=positive, default=10)
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = parser.parse_args(argv)
    opts.argv = argv
    if opts.width % opts.heads:
        parser.error(f"--width {opts.width} must be divisible by --heads {opts.heads}")
    if "mhc_lite" in (opts.stack or PROJECT) and opts.streams > 5:
        parser.error(f"--streams {opts.streams}: mHC-lite takes n! coefficients, n <= 5 (or leave out --stack mhc_lite)")
    log = (lambda _m: None) if opts.quiet else (lambda m: print(f"bench_lucidrains: {m}", file=sys.stderr, flush=True))
    package = lucidrains_package()
    kinds = ["preln", *(k for k in (opts.stack or (*PROJECT, *LUCIDRAINS)) if k != "preln")]
    if package is None:
        missing = [k for k in kinds if k in LUCIDRAINS]
        kinds = [k for k in kinds if k not in LUCIDRAINS]
        print(f"bench_lucidrains: {PACKAGE} (PyPI hyper-connections) is not installed: measuring the project's "
              f"modules only{' (skipping ' + ', '.join(missing) + ')' if missing else ''}", flush=True)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:  # called in-process (the tests), the caller's thread count comes back
        cases = [Case(k, opts, package) for k in kinds]
        seconds = measure(cases, opts.rounds, log)
        profiles = profile_deltas(cases, opts.profile_repeats, opts.profile_top) if opts.profile else {}
        rep = report(opts, package, seconds, (load_before, os.getloadavg()[0]), time.perf_counter() - start, profiles)
    finally:
        torch.set_num_threads(threads)
    text = markdown(rep)
    if opts.json:
        write_json(opts.json, rep)
    if opts.markdown:
        write_text(opts.markdown, text)
    if not opts.quiet:
        print(text, end="")
    return rep


if __name__ == "__main__":
    main()
