#!/usr/bin/env python
"""Does a change cost speed? The benchmark run on two versions of the code, interleaved, in one command.

    python -m scripts.benchmark.before_after --before 8302f79 --rounds 3 --depth e12d12
    python -m scripts.benchmark.before_after --before main --family dca --family residual -- --max-tokens 2048

``--before`` is a git revision, checked out into a temporary worktree (removed at the end); "after" is this
checkout's working tree. Each round runs each version's own ``python -m scripts.benchmark.benchmark --rounds 1``
(so each version is measured by its own code, with its own fairseq_plugins first on PYTHONPATH), the two in
alternating order (before/after, then after/before, ...) so that a slow drift of the machine hits both alike.
A family's speed is its ratio to the Pre-LN baseline measured in the same process (fairseq's transformer,
the same code in both versions), so the comparison is of ratios: a change that only moves the machine moves
both. Families: those both versions have (``--family`` to choose), at ``--depth`` (default e12d12).

Verdict per family, from the process-CPU-time ratios (steady under other load with one thread; the wall-clock
ones are shown too): "same" when the after median lies within the before rounds' range widened by
``--margin`` (default 0.02), else "slower" or "faster". Writes Markdown (printed, and ``--markdown``) and the
raw per-round ratios (``--json``); each names its command and machine, no path of it.
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASELINE = "transformer_preln"
# families with a preset at the depth (argv[1]) in the benchmark's default width, e.g. crossformer_all has none at
# e12d12: benchmark.py refuses a --family without one, and each version is asked in its own tree
LIST_FAMILIES = (
    "import sys; from fairseq_plugins.models.presets import PRESETS; "
    "print(' '.join(dict.fromkeys(p.family for n, p in PRESETS.items() if n == f'{p.family}_iwslt_{sys.argv[1]}')))"
)
KINDS = ("train", "decode")


def bounded(kind, low, high):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number from {low} to {high}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a number from {low} to {high}, got {text!r}")
        return value

    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git revision of the code before the change (a commit, tag, branch)")
    p.add_argument("--rounds", type=bounded(int, 1, 20), default=3, help="alternating rounds, 1..20 (default 3)")
    p.add_argument("--family", action="append", metavar="NAME", help="only this family (repeatable; default: all both have)")
    p.add_argument("--depth", default="e12d12", help="one preset depth, e.g. e6d6 (default e12d12)")
    p.add_argument("--threads", type=bounded(int, 1, os.cpu_count() or 1), default=1, help="torch threads (default 1)")
    p.add_argument("--group", type=bounded(int, 1, 100), default=4,
                   help="families per benchmark process, 1..100 (default 4): one process holding every family grew "
                        "past 14 GB at E12D12, so each round runs the families in groups, each with its own "
                        "Pre-LN baseline")  # fmt: skip
    p.add_argument("--margin", type=bounded(float, 0.0, 0.5), default=0.02,
                   help="ratio tolerance beyond the before rounds' range, 0..0.5 (default 0.02)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write every round's ratios here")
    p.add_argument("--markdown", type=Path, help="write the report here (it is printed anyway)")
    p.add_argument("benchmark_args", nargs="*", help="after --: more options for both benchmarks (e.g. --max-tokens 2048)")
    return p.parse_args(argv)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def python_env(tree: Path, threads: int) -> dict:
    # both versions read this checkout's data: the benchmark's default (../shared beside the tree) does not exist
    # beside the temporary worktree
    data = os.environ.get("MULTI30K_DIR") or str(REPO.parent / "shared" / "data" / "multi30k")
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore",
            "MULTI30K_DIR": data}  # fmt: skip


def families_of(tree: Path, depth: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", LIST_FAMILIES, depth], cwd=tree, env=python_env(tree, 1),
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:  # its own error (the last lines of its stderr), not a traceback of this script
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise subprocess.CalledProcessError(done.returncode, f"listing the families of {tree.name}", stderr=tail)
    return done.stdout.split()


def round_ratios(report: dict) -> dict[str, dict[str, float]]:
    """family -> {train, train_cpu, decode, decode_cpu}: throughput ratios to the baseline of a one-round,
    one-depth report (each family against the baseline of its own group, if the benchmark split them)."""
    ratios = {}
    for result in report["results"]:
        base = result["baseline"]
        for family, row in result["families"].items():
            ratios[family] = {}
            for kind in KINDS:
                for suffix in ("seconds", "cpu_seconds"):
                    key = f"{kind}_{suffix}"
                    if key in row and key in base:
                        name = kind if suffix == "seconds" else f"{kind}_cpu"
                        ratios[family][name] = base[key][0] / row[key][0]
    return ratios


def verdict(before: list[float], after: list[float], margin: float) -> str:
    middle = statistics.median(after)
    if middle < min(before) - margin:
        return "slower"
    if middle > max(before) + margin:
        return "faster"
    return "same"


def span(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report_markdown(rounds: dict[str, list[dict]], families: list[str], margin: float, header: str) -> str:
    lines = [header, "", "| family | train before | train after | verdict | decode before | decode after | verdict |",
             "|---|---:|---:|---|---:|---:|---|"]  # fmt: skip
    for family in families:
        cells = [f"`{family}`"]
        for kind in KINDS:
            key = f"{kind}_cpu"
            before = [r[family][key] for r in rounds["before"] if key in r.get(family, {})]
            after = [r[family][key] for r in rounds["after"] if key in r.get(family, {})]
            if not before or not after:
                cells += ["-", "-", "not measured"]
                continue
            wall_b = [r[family][kind] for r in rounds["before"]]
            wall_a = [r[family][kind] for r in rounds["after"]]
            cells += [f"{span(before)}; wall {statistics.median(wall_b):.2f}",
                      f"{span(after)}; wall {statistics.median(wall_a):.2f}", verdict(before, after, margin)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def benchmark_options(opts, families: list[str], out: Path) -> list[str]:
    """scripts/benchmark/benchmark.py's options for one round of one version."""
    return ["--rounds", "1", "--depth", opts.depth, "--threads", str(opts.threads), "--no-memory", "--no-flop-count",
            "--quiet", "--json", str(out), *[a for f in families for a in ("--family", f)], *opts.benchmark_args]  # fmt: skip


def run_benchmark(tree: Path, opts, families: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "scripts.benchmark.benchmark", *benchmark_options(opts, families, out)]
    subprocess.run(cmd, cwd=tree, env=python_env(tree, opts.threads), check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv=None) -> int:
    opts = parse_args(argv)
    try:
        commit = git("rev-parse", "--verify", f"{opts.before}^{{commit}}")
    except subprocess.CalledProcessError:
        print(f"before_after: --before {opts.before!r} is not a git revision of {REPO.name}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="before_after_") as tmp:
        before_tree = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(before_tree), commit)
        try:
            trees = {"before": before_tree, "after": REPO}
            try:
                before_families = set(families_of(before_tree, opts.depth))
                common = [f for f in families_of(REPO, opts.depth) if f in before_families and f != BASELINE]
            except subprocess.CalledProcessError as err:
                print(f"before_after: {err.cmd} failed (exit {err.returncode}):\n{err.stderr}", file=sys.stderr)
                return 1
            families = opts.family or common
            unknown = sorted(set(families) - set(common))
            if unknown:
                print(f"before_after: --family {', '.join(unknown)}: not in both versions; choose from "
                      f"{', '.join(common)}", file=sys.stderr)  # fmt: skip
                return 2
            rounds: dict[str, list[dict]] = {"before": [], "after": []}
            for i in range(opts.rounds):
                for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    print(f"[before_after] round {i + 1}/{opts.rounds}: {name}", file=sys.stderr, flush=True)
                    ratios = {}
                    for g in range(0, len(families), opts.group):
                        group, out = families[g : g + opts.group], Path(tmp) / f"{name}{i}_{g}.json"
                        try:
                            ratios.update(round_ratios(run_benchmark(trees[name], opts, group, out)))
                        except subprocess.CalledProcessError as err:  # its own message (e.g. a bad --depth) is above
                            print(f"before_after: the {name} version's benchmark failed (exit {err.returncode})",
                                  file=sys.stderr)  # fmt: skip
                            return 1
                    rounds[name].append(ratios)
        finally:
            git("worktree", "remove", "--force", str(before_tree))
    command = "python -m scripts.benchmark.before_after " + shlex.join(argv if argv is not None else sys.argv[1:])
    header = (
        f"Speed before ({opts.before}, {commit[:7]}) and after ({git('rev-parse', '--short', 'HEAD')} and the working "
        f"tree) the change: throughput ratio to Pre-LN (fairseq's transformer) in the same process, process CPU "
        f"time, median over {opts.rounds} alternating rounds (min-max), wall-clock median beside it; {opts.depth}, "
        f"{opts.threads} thread(s), {platform.machine()} with {os.cpu_count()} CPUs; verdict: the after median "
        f"against the before range widened by {opts.margin}. Made by `{command}`."
    )
    markdown = report_markdown(rounds, families, opts.margin, header)
    print(markdown)
    if opts.markdown:
        tmp_md = opts.markdown.with_suffix(".tmp")
        tmp_md.write_text(markdown)
        tmp_md.replace(opts.markdown)
    if opts.json:
        tmp_json = opts.json.with_suffix(".tmp")
        tmp_json.write_text(json.dumps({"before": commit, "command": command, "rounds": rounds}, indent=1) + "\n")
        tmp_json.replace(opts.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
