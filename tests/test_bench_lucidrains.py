"""scripts/benchmark/bench_lucidrains.py (issue 58, item 3): the project's hyper-connection modules against lucidrains'
``hyper-connections`` at equal shapes. A tiny run (no timed assertions): without the package it says so in one line
and measures the project's side; the stacks are wired alike (at initialisation HC's stack computes Pre-LN's);
option errors name the option; with the package installed its stacks and the pair ratios are in the report."""

import json
import math
import sys

import pytest
import torch

from .helpers import load_script

bench = load_script("scripts/benchmark/bench_lucidrains.py", "bench_lucidrains")

TINY = ["--width", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "2", "--batch", "2", "--seq-len", "4",
        "--decode-batch", "3", "--decode-context", "2", "--rounds", "2", "--decode-steps", "2", "--train-steps", "1",
        "--quiet"]  # fmt: skip


def _finite_ratios(report: dict, kinds) -> None:
    assert list(report["stacks"]) == ["preln", *kinds]
    for row in report["stacks"].values():
        for m in ("train", "decode"):
            r = row[m]["ratio_to_preln"]
            assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("median", "min", "max"))


def test_without_the_package_it_says_so_and_measures_the_projects_modules(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, bench.PACKAGE, None)  # import hyper_connections -> ImportError
    out = tmp_path / "r.json"
    report = bench.main([*TINY, "--json", str(out), "--markdown", str(tmp_path / "r.md")])
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [("bench_lucidrains: hyper_connections (PyPI hyper-connections) is not installed: measuring the "
                       "project's modules only (skipping lucidrains_hc, lucidrains_mhc)")]  # fmt: skip
    _finite_ratios(report, bench.PROJECT)
    assert report["lucidrains"]["installed"] is False and report["project_over_lucidrains"] == {}
    assert json.loads(out.read_text())["shape"]["streams"] == 4
    assert "is not installed" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("kind", ["hc_static", "hc_dynamic"])
def test_the_stacks_share_their_sublayers_hc_computes_preln_at_initialisation(kind):
    """Same seed, same sublayers: HC's streams start as n copies, read out as n h, whose LayerNorm is Pre-LN's."""
    opts = bench.build_parser().parse_args(TINY)
    base, hc = bench.Case("preln", opts, None), bench.Case(kind, opts, None)
    with torch.no_grad():
        torch.testing.assert_close(hc.stack(hc.train_x), base.stack(base.train_x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--width", "15"], "--width 15 must be divisible by --heads 2"),
    (["--rounds", "0"], "argument --rounds: must be a positive integer, got '0'"),
    (["--streams", "6", "--stack", "mhc_lite"], "--streams 6: mHC-lite takes n! coefficients"),
])  # fmt: skip
def test_option_errors_name_the_option(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main([*TINY, *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_with_the_package_its_stacks_and_the_pair_ratios_are_reported():
    pytest.importorskip(bench.PACKAGE)
    report = bench.main(TINY)
    _finite_ratios(report, (*bench.PROJECT, *bench.LUCIDRAINS))
    assert set(report["project_over_lucidrains"]) == {"mhc / lucidrains_mhc", "hc_dynamic / lucidrains_hc"}
    assert report["lucidrains"]["installed"] is True
