"""The study's console (scripts/study/study.py): a compact line per run (updates, train/valid loss, elapsed and
remaining time), redrawn in place on a terminal, otherwise printed at every fifth of the work; and the final
table. fairseq's own output goes to the runs' log files."""

import sys
import time

from scripts.study.study_common import Run
from scripts.study.study_logs import read_curves
from scripts.study.study_stats import _fmt


class Console:
    """The console half of study_run.Study (it provides args, runs, train, evals, tty, drawn, last_report)."""

    def _progress(self, runs: list[Run], total: int, skipped: int, final: bool = False) -> None:
        """A line per run; redrawn on a terminal, otherwise printed at each fifth of the work."""
        done = sum(self.is_settled(r) for r in runs)
        fraction = self._fraction(runs, total)
        step = int(fraction * 5)
        if not self.tty and not final and (step <= self.last_report or step >= 5):
            return
        if self.tty and not final and time.time() - getattr(self, "_drawn_at", 0) < 5:
            return
        self.last_report, self._drawn_at = step, time.time()
        lines = [(f"[{self.args.defaults.tag}] {_minutes(time.time() - self.start)} elapsed: {done}/{total} runs "
                 f"done{f' ({skipped} from before)' if skipped else ''}, ~{fraction:.0%} of the work")]  # fmt: skip
        for run in runs:
            lines.append("  " + self._status(run))
        if self.tty and self.drawn:
            sys.stdout.write(f"\x1b[{self.drawn}F\x1b[J")
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        self.drawn = len(lines) if self.tty and not final else 0

    def _fraction(self, runs: list[Run], total: int) -> float:
        work = 0.0
        for run in runs:
            if self.is_settled(run):
                work += 1
            elif self.is_done(run):
                work += 0.95
            else:
                work += 0.95 * self._run_fraction(run)
        return min(1.0, work / max(1, total))

    def _run_fraction(self, run: Run) -> float:
        curves = read_curves(self.run_dir(run) / "train.log")
        budget = self.args.budget
        if budget.minutes:
            seconds = max([p[1] for p in curves["train"]], default=0.0)
            return min(1.0, seconds / (60 * budget.minutes))
        return min(1.0, (curves["train"][-1][0] if curves["train"] else 0) / budget.max_update)

    def _status(self, run: Run) -> str:
        curves = read_curves(self.run_dir(run) / "train.log")
        updates = curves["train"][-1][0] if curves["train"] else 0
        train = f"{curves['train'][-1][2]:.2f}" if curves["train"] else "-"
        valid = f"{curves['valid'][-1][2]:.2f}" if curves["valid"] else "-"
        seconds = max([p[1] for p in curves["train"] + curves["valid"]], default=0.0)
        if self.is_diverged(run):
            state = "diverged"
        elif self.is_evaluated(run):
            state = "done"
        elif run in self.failed:
            state = "FAILED"
        elif self.is_done(run):
            state = "translating" if run in self.evals else "trained"
        elif run in self.train:
            fraction = self._run_fraction(run)
            left = (seconds / fraction - seconds) if fraction > 0.02 else None
            state = f"training, {_minutes(left) + ' left' if left is not None else 'starting'}"
        else:
            state = "waiting"
        cap = self.args.budget.max_update or "?"
        return (f"{run.arch:<32} {run.variant:<8} lr {run.lr:g} s{run.seed}  {updates:>5}/{cap} upd  "
                f"train {train:>5}  valid {valid:>5}  {_minutes(seconds):>8}  {state}")  # fmt: skip


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min"


def console_table(rows: list[dict]) -> str:
    lines = [f"{'model':<32} {'variant':<8} {'seeds':>5} {'BLEU':>13} {'chrF':>13} {'valid loss':>10} {'updates':>7}"]
    for r in rows:
        lines.append(f"{r['arch']:<32} {r['variant']:<8} {len(r['seeds']):>5} {_fmt(r['bleu'], r['bleu_std']):>13} "
                     f"{_fmt(r['chrf'], r['chrf_std']):>13} {_fmt(r['valid_loss'], None, 3):>10} "
                     f"{r['updates'] or 0:>7.0f}")  # fmt: skip
    return "\n".join(lines)

