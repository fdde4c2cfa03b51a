"""What a run's train.log says (fairseq-train's stdout with ``--log-format json``, and the lines the study tool
writes into it): its attempts, learning curves, early-stopping point, last saved update and whether it diverged."""

import json
import re
from datetime import datetime
from pathlib import Path

ATTEMPT = "=== study: attempt "  # the line study.py writes into a run's log before each (re)start
EARLY_STOP = "=== study: early stop "  # the line the tool writes when it stops a resumed run on PATIENCE
FAIRSEQ_EARLY_STOP = "early stop since valid performance hasn't improved"
# fairseq's trainer ends a run whose loss has diverged with one of these FloatingPointErrors (fp32; fp16's loss
# scaler): the run is a result at that setting (it diverged), not a failure of the tool or the machine
FAIRSEQ_DIVERGED = ("FloatingPointError: gradients are Nan/Inf", "FloatingPointError: Minimum loss scale reached")


def last_attempt(log_file: Path) -> str:
    """The text of the last attempt in a run's ``train.log`` (after its last ATTEMPT line); "" without the file."""
    if not log_file.is_file():
        return ""
    return log_file.read_text(encoding="utf-8", errors="replace").rsplit(ATTEMPT, 1)[-1]


def diverged(log_file: Path) -> bool:
    """Whether the last attempt in ``log_file`` ended with fairseq's divergence error."""
    text = last_attempt(log_file)
    return any(message in text for message in FAIRSEQ_DIVERGED)


_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^|]*\| INFO \| (train_inner|valid) \| (\{.*\})\s*$")
_PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()


def read_curves(log_file: Path) -> dict:
    """Learning curves from a run's log (fairseq-train's stdout with ``--log-format json``, every attempt).

    Returns ``{"train": [(updates, seconds, loss)], "valid": [...], "parameters": int | None, "attempts": n}``.
    Seconds are training wall time from the start of the first attempt: fairseq start-up included, each
    resumed attempt continuing from the time of the last record at or before the update it restarted from
    (the work an interruption threw away is not counted). Records of an interrupted attempt beyond the
    update the next attempt resumed from are dropped: the resumed run replaces them.
    """
    train: list[tuple[int, float, float]] = []
    valid: list[tuple[int, float, float]] = []
    parameters, attempts = None, 0
    start, offset, resumed = None, 0.0, False
    if not log_file.is_file():
        return {"train": train, "valid": valid, "parameters": None, "attempts": 0}
    for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(ATTEMPT):
            attempts += 1
            start, resumed = float(line.split()[-1]), True
            continue
        match = _PARAMS.search(line)
        if match:
            parameters = int(match.group(1).replace(",", ""))
            continue
        match = _RECORD.match(line)
        if not match or start is None:
            continue
        stamp, kind, payload = match.groups()
        record = json.loads(payload)
        updates = int(record["num_updates" if kind == "train_inner" else "valid_num_updates"])
        loss = float(record["loss" if kind == "train_inner" else "valid_loss"])
        if resumed:  # the first record of an attempt: forget what the interrupted one did beyond it
            resumed = False
            first = updates - (1 if kind == "train_inner" else 0)
            train[:] = [r for r in train if r[0] <= first]
            valid[:] = [r for r in valid if r[0] <= first]
            offset = max([r[1] for r in train + valid if r[0] <= first], default=0.0)
        seconds = round(offset + _seconds(stamp) - start, 1)
        (train if kind == "train_inner" else valid).append((updates, seconds, loss))
    return {"train": train, "valid": valid, "parameters": parameters, "attempts": attempts}


def finished_curves(run_dir: Path) -> tuple[dict, dict]:
    """A run's learning curves (read_curves of its train.log) as its result counts them, and its DONE.json (empty
    while it trains): what a resumed run logged past its patience stop does not count."""
    curves = read_curves(run_dir / "train.log")
    done_file = run_dir / "DONE.json"
    done = json.loads(done_file.read_text(encoding="utf-8")) if done_file.is_file() else {}
    if done.get("stopped") == "patience":
        curves = {**curves, **{k: [p for p in curves[k] if p[0] <= done["updates"]] for k in ("train", "valid")}}
    return curves, done


def best_validation(valid: list[tuple[int, float, float]]) -> tuple[int, float, float] | None:
    """The validation whose checkpoint a run is evaluated with: the lowest loss, the last of equal minima
    (fairseq re-saves checkpoint_best.pt on a tie of its rounded losses, ``<=``, where --patience needs ``<``)."""
    return min(reversed(valid), key=lambda p: p[2], default=None)


def early_stop(valid: list[tuple[int, float, float]], patience: int) -> int | None:
    """The updates of the validation at which fairseq's ``--patience`` rule stops a run that was never
    interrupted: ``patience`` validations in a row without a loss strictly below the best so far; or None."""
    if patience <= 0:
        return None
    best, bad = None, 0
    for updates, _seconds, loss in valid:
        if best is None or loss < best:
            best, bad = loss, 0
        else:
            bad += 1
            if bad >= patience:
                return updates
    return None


SAVED = re.compile(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates")


def last_saved_update(log_file: Path) -> int | None:
    """The update of the last checkpoint fairseq saved according to a run's log (every save writes
    checkpoint_last.pt), i.e. where a resumed attempt continues from; None without a logged save."""
    if not log_file.is_file():
        return None
    found = SAVED.findall(log_file.read_text(encoding="utf-8", errors="replace"))
    return int(found[-1]) if found else None


def attempt_line(number: int, now: float) -> str:
    """The marker read_curves uses to separate attempts; ``now`` is a Unix time (the attempt's start)."""
    return f"{ATTEMPT}{number} started at {now:.0f}\n"


def reached(valid: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    """(updates, seconds) of the first validation with loss <= target, or None."""
    for updates, seconds, loss in valid:
        if loss <= target:
            return updates, seconds
    return None
