"""A run whose loss diverged is a result of the grid, not a failure: recorded as such, never evaluated or chosen,
named by the report, and recognised from its log when it diverged before the study recorded it (an older tool
failed it, as T-Fixup at lr 1.6e-2 in lr_ende_e12d12).

In-process: the study's training and evaluation processes are replaced by ones that have already ended
(study_fixtures.Finished), as test_study's failed-run test does."""

import json

from scripts.study import (
    study,
    study_logs,
    study_pairing,
    study_report,
    study_report_common,
    study_run,
)

from .study_fixtures import Finished, log_record

DIVERGED_TAIL = ["Traceback (most recent call last):", '  File "fairseq/trainer.py", line 970, in train_step',
                 '    raise FloatingPointError("gradients are Nan/Inf")',
                 "FloatingPointError: gradients are Nan/Inf"]  # fmt: skip


def _study(tmp_path, monkeypatch):
    monkeypatch.setattr(study_run.time, "sleep", lambda seconds: None)
    args = study.parse_args(["--archs", "transformer_preln_e6d6", "--seeds", "1 2", "--max-update", "4",
                             "--lrs", "1e-3 2e-3 4e-3", "--out-dir", str(tmp_path)])  # fmt: skip
    return args, study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})


def _fake_processes(runner, monkeypatch, evaluated: list):
    def train(run):
        log = runner.run_dir(run) / "train.log"
        start = study_logs._seconds("2026-01-01 00:00:00")
        # 4e-3 validates lowest before it diverges: what it validated then must not make it the choice
        lines = [study_logs.attempt_line(1, start).strip(), log_record("00:01", "train_inner", 2, 6.0),
                 log_record("00:02", "valid", 2, 5.5 - 1000 * run.lr)]  # fmt: skip
        if run.lr == 4e-3:
            return Finished(log, 1, {log: "\n".join([*lines, log_record("00:03", "train_inner", 3, 9.9), *DIVERGED_TAIL]) + "\n"})
        return Finished(log, 0, {log: "\n".join([*lines, "| done training in 1 s"]) + "\n"})

    def evaluate(run):
        evaluated.append(run)
        return Finished(runner.run_dir(run) / "eval.log", 0, {runner.run_dir(run) / "eval" / "results.json": "{}"})

    monkeypatch.setattr(runner, "_train", train)
    monkeypatch.setattr(runner, "_evaluate", evaluate)


def test_a_diverged_run_is_recorded_never_evaluated_nor_chosen(tmp_path, monkeypatch, capsys):
    args, runner = _study(tmp_path, monkeypatch)
    tuning, later = study.grid(args)
    evaluated = []
    _fake_processes(runner, monkeypatch, evaluated)
    finished = runner.execute(tuning, later)
    # the lowest validated loss (4e-3's, before it diverged) is not chosen: seed 2 trains at 2e-3
    assert sorted((r.lr, r.seed) for r in finished) == [(1e-3, 1), (2e-3, 1), (2e-3, 2)]
    assert [(r.lr, r.seed) for r in runner.diverged_runs] == [(4e-3, 1)] and not runner.failed and not runner.blocked
    assert sorted((r.lr, r.seed) for r in evaluated) == [(1e-3, 1), (2e-3, 1), (2e-3, 2)]
    diverged_run = runner.diverged_runs[0]
    done = json.loads((runner.run_dir(diverged_run) / "DONE.json").read_text())
    assert done["stopped"] == "diverged" and done["updates"] == 3
    assert "transformer_preln_e6d6.warmup.lr0.004.wu400.s1 diverged" in capsys.readouterr().out
    choice = runner._choices(tuning)[("transformer_preln_e6d6", "warmup")]
    assert choice["lr"] == 2e-3 and choice["edges"] == []  # not the grid's edge: the lr above it diverged
    candidate = next(c for c in choice["candidates"] if c["lr"] == 4e-3)
    assert candidate["diverged"] == 3 and candidate["best_valid_loss"] is None
    # the report: the candidates' table and the line of runs it leaves out name it
    context = {"runs": [], "falling_last": 500, "falling_slope": 0.01}
    assert "| 0.004 | 400 | 1.500 | diverged (last logged update 3) |  |" in study_report_common.runs_and_choices(
        context, runner._choices(tuning))  # fmt: skip
    context = {"missing": [], "diverged": [{"name": diverged_run.name, "updates": 3}]}
    assert study_report_common.partial(context) == [
        "", ("**Diverged**: 1 run(s) stopped on a NaN/Inf loss (fairseq's FloatingPointError), not evaluated and never "
             f"chosen: `{diverged_run.name}` (last logged update 3).")]  # fmt: skip
    # a second study process (a restart, REPORT_ONLY) finds the same
    again = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    scored, missing = again.finished_runs(tuning, later)
    assert len(scored) == 3 and missing == [] and again.diverged_runs == [diverged_run]
    assert "diverged" in again._status(diverged_run)
    # the report's choice (from the scored runs' results) lists the diverged candidate and has no edge either
    monkeypatch.setattr(again, "result", lambda run, evaluated=True, result=again.result: result(run, evaluated=False))
    _, choices, chosen = study_pairing.chosen_results(again, scored, args)
    choice = choices[("transformer_preln_e6d6", "warmup")]
    assert choice["lr"] == 2e-3 and choice["edges"] == [] and [c["lr"] for c in choice["candidates"]] == [1e-3, 2e-3, 4e-3]
    assert sorted((r.lr, r.seed) for r in chosen) == [(2e-3, 1), (2e-3, 2)]
    assert study_report_common.diverged_text(context["diverged"]) == (
        f" 1 run(s) diverged (a NaN/Inf loss stopped fairseq) and have no score: {diverged_run.name}.")
    assert study_report_common.diverged_text([]) == ""


def test_a_run_that_diverged_before_the_study_recorded_it_is_recognised_from_its_log(tmp_path, monkeypatch):
    args, runner = _study(tmp_path, monkeypatch)
    tuning, later = study.grid(args)
    _fake_processes(runner, monkeypatch, [])
    runner.execute(tuning, later)
    diverged_run = runner.diverged_runs[0]
    (runner.run_dir(diverged_run) / "DONE.json").unlink()  # as an older tool left it: a failed run
    fresh = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    scored, missing = fresh.finished_runs(tuning, later)  # REPORT_ONLY
    assert len(scored) == 3 and missing == [] and fresh.diverged_runs == [diverged_run]
    assert fresh.is_diverged(diverged_run)
    (runner.run_dir(diverged_run) / "DONE.json").unlink()
    restarted = study_run.Study(args, tmp_path / "data", {"tests": [{"name": "test"}]})
    monkeypatch.setattr(restarted, "_train", lambda run: (_ for _ in ()).throw(AssertionError(f"retrained {run.name}")))
    assert len(restarted.execute(tuning, later)) == 3 and restarted.diverged_runs == [diverged_run]


def test_only_fairseqs_divergence_errors_count_and_only_in_the_last_attempt(tmp_path):
    log = tmp_path / "train.log"
    start = study_logs._seconds("2026-01-01 00:00:00")
    log.write_text("\n".join([study_logs.attempt_line(1, start).strip(), *DIVERGED_TAIL]) + "\n")
    assert study_logs.diverged(log)
    log.write_text(log.read_text() + study_logs.attempt_line(2, start) + "| done training in 1 s\n")
    assert not study_logs.diverged(log)  # a later attempt went on (resumed at a lower lr, say)
    log.write_text("FloatingPointError: Minimum loss scale reached (0.0001).\n")
    assert study_logs.diverged(log)
    log.write_text("Killed\nRuntimeError: out of memory\n")
    assert not study_logs.diverged(log) and not study_logs.diverged(tmp_path / "absent.log")


def test_the_reading_names_diverged_runs_and_models_with_fewer_seeds():
    def row(arch, seeds, bleu):
        return {"arch": arch, "variant": "warmup", "valid_loss": 4.5, "first_valid_loss": 9.0, "bleu": bleu,
                "seeds": seeds, "p_values": None, "reached": 0, "compared": 0, "reach_updates": None}  # fmt: skip

    diverged = [{"name": "t.warmup.lr0.008.wu100.s2", "updates": 150}]
    text = study_report.reading([row("pre", [1, 2], 24.0), row("t", [1], 30.0)], "800 updates each", diverged=diverged)
    assert "with 2 seeds at most (the seeds column: fewer where a run has no score, unfinished or diverged)" in text
    assert text.endswith(" 1 run(s) diverged (a NaN/Inf loss stopped fairseq) and have no score: t.warmup.lr0.008.wu100.s2.")
    even = study_report.reading([row("pre", [1, 2], 24.0), row("t", [1, 2], 30.0)], "800 updates each")
    assert "with 2 seeds; ± is the spread over seeds." in even and "diverged" not in even
