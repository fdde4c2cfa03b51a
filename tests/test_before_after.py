"""scripts/benchmark/before_after.py: the benchmark on two versions of the code, compared as ratios to Pre-LN.

The arithmetic (per-round ratios from a report, the verdict, the table) on hand-made reports; option errors; one
tiny end-to-end run against HEAD (two benchmark processes at width 16 on synthetic sentences)."""

import json
import subprocess

import pytest

from .helpers import load_script

before_after = load_script("scripts/benchmark/before_after.py", "before_after")


def one_round(base_train: float, fam_train: float, base_cpu: float, fam_cpu: float) -> dict:
    timing = {"decode_seconds": [2.0], "decode_cpu_seconds": [2.0]}
    return {"results": [{
        "baseline": {"train_seconds": [base_train], "train_cpu_seconds": [base_cpu], **timing},
        "families": {"dca": {"train_seconds": [fam_train], "train_cpu_seconds": [fam_cpu], **timing}},
    }]}  # fmt: skip


def test_round_ratios_are_baseline_time_over_family_time():
    ratios = before_after.round_ratios(one_round(1.0, 2.0, 3.0, 4.0))
    assert ratios == {"dca": {"train": 0.5, "train_cpu": 0.75, "decode": 1.0, "decode_cpu": 1.0}}


@pytest.mark.parametrize(("after", "expected"), [
    ([0.90, 0.91, 0.92], "same"),  # inside the before range
    ([0.87, 0.87, 0.88], "same"),  # below it by less than the margin
    ([0.85, 0.86, 0.86], "slower"),
    ([0.95, 0.96, 0.97], "faster"),
])  # fmt: skip
def test_verdict_compares_the_after_median_with_the_widened_before_range(after, expected):
    assert before_after.verdict([0.89, 0.90, 0.93], after, margin=0.02) == expected


def test_report_has_a_row_per_family_with_cpu_and_wall_ratios():
    rounds = {
        "before": [before_after.round_ratios(one_round(1.0, 1.25, 1.0, 1.25))] * 2,
        "after": [before_after.round_ratios(one_round(1.0, 1.0, 1.0, 1.0))] * 2,
    }
    table = before_after.report_markdown(rounds, ["dca"], 0.02, "header")
    assert "| `dca` | 0.80 (0.80-0.80); wall 0.80 | 1.00 (1.00-1.00); wall 1.00 | faster |" in table
    assert table.startswith("header\n")


def test_bad_revision_and_unknown_family_are_clear_errors(capsys):
    assert before_after.main(["--before", "no-such-revision-xyz"]) == 2
    assert "--before 'no-such-revision-xyz' is not a git revision" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        before_after.parse_args(["--before", "HEAD", "--rounds", "0"])


def test_each_round_asks_the_benchmark_for_options_it_has(tmp_path):
    from .test_benchmark import _load_benchmark

    opts = before_after.parse_args(["--before", "HEAD", "--family", "dca", "--depth", "e6d6", "--", "--max-tokens", "2048"])
    args = _load_benchmark().build_parser().parse_args(before_after.benchmark_options(opts, ["dca"], tmp_path / "r.json"))
    assert (args.rounds, args.depth, args.family, args.max_tokens, args.quiet) == (1, ["e6d6"], ["dca"], 2048, True)


@pytest.fixture
def small_repo(tmp_path, monkeypatch):
    """before_after's repository (before_after.REPO, where every git command runs and whose working tree is "after")
    replaced by a one-commit repository: the orchestration's worktrees are checked out in milliseconds, where
    each of this checkout's (~3,000 files) took seconds."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("a repository to check out\n")
    for argv in (["init", "-q"], ["add", "README.md"],
                 ["-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)  # fmt: skip
    monkeypatch.setattr(before_after, "REPO", repo)
    return repo


def test_rounds_alternate_the_versions_and_remove_the_worktree(tmp_path, monkeypatch, small_repo):
    """The orchestration with the benchmark itself replaced (a real one takes minutes): a temporary worktree at the
    revision, both versions each round in alternating order, the table and the JSON written, the worktree gone."""
    calls = []

    def fake_benchmark(tree, opts, families, out):
        calls.append("after" if tree == before_after.REPO else "before")
        slow = 1.25 if calls[-1] == "before" else 1.0
        return one_round(1.0, slow, 1.0, slow)

    monkeypatch.setattr(before_after, "run_benchmark", fake_benchmark)
    monkeypatch.setattr(before_after, "families_of", lambda tree, depth: ["transformer_preln", "dca"])
    worktrees = before_after.git("worktree", "list")
    status = before_after.main(["--before", "HEAD", "--rounds", "3", "--json", str(tmp_path / "ba.json"),
                                "--markdown", str(tmp_path / "ba.md")])  # fmt: skip
    assert status == 0 and calls == ["before", "after", "after", "before", "before", "after"]
    assert before_after.git("worktree", "list") == worktrees
    assert "| `dca` | 0.80 (0.80-0.80); wall 0.80 | 1.00 (1.00-1.00); wall 1.00 | faster |" in (tmp_path / "ba.md").read_text()
    assert len(json.loads((tmp_path / "ba.json").read_text())["rounds"]["before"]) == 3
    assert before_after.main(["--before", "HEAD", "--family", "no_such_family"]) == 2

    def failing_benchmark(tree, opts, families, out):
        raise before_after.subprocess.CalledProcessError(2, ["benchmark.py"])

    monkeypatch.setattr(before_after, "run_benchmark", failing_benchmark)
    assert before_after.main(["--before", "HEAD", "--depth", "e7d7"]) == 1
    assert before_after.git("worktree", "list") == worktrees


def test_both_versions_read_the_same_data(tmp_path, monkeypatch):
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    before, after = before_after.python_env(tmp_path / "before", 1), before_after.python_env(before_after.REPO, 1)
    assert before["MULTI30K_DIR"] == after["MULTI30K_DIR"] == str(before_after.REPO.parent / "shared" / "data" / "multi30k")
    monkeypatch.setenv("MULTI30K_DIR", "/data/m30k")
    assert before_after.python_env(tmp_path / "before", 1)["MULTI30K_DIR"] == "/data/m30k"


def test_families_run_in_groups_of_their_own_processes(tmp_path, monkeypatch, small_repo):
    """--group: each benchmark process gets at most that many families; a round's ratios are the union."""
    seen = []

    def fake_benchmark(tree, opts, families, out):
        seen.append(list(families))
        report = one_round(1.0, 1.0, 1.0, 1.0)
        row = report["results"][0]["families"].pop("dca")
        report["results"][0]["families"].update({f: row for f in families})
        return report

    monkeypatch.setattr(before_after, "run_benchmark", fake_benchmark)
    monkeypatch.setattr(before_after, "families_of", lambda tree, depth: ["transformer_preln", "a", "b", "c"])
    assert before_after.main(["--before", "HEAD", "--rounds", "1", "--group", "2", "--json", str(tmp_path / "g.json")]) == 0
    assert seen == [["a", "b"], ["c"], ["a", "b"], ["c"]]
    assert sorted(json.loads((tmp_path / "g.json").read_text())["rounds"]["after"][0]) == ["a", "b", "c"]
