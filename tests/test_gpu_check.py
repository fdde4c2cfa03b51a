"""scripts/benchmark/gpu_check.py's CPU-side logic with CUDA mocked away: no CUDA -> a report saying so and exit 0;
the checks themselves on the CPU (bf16, tiny width); any failed check -> exit 1 and FAIL in the report; options.
Also the benchmark's --device cuda error and the report paths (no directory of the machine)."""

import json
import sys

import pytest
import torch

from .helpers import REPO, load_script, run

TINY = ["--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--updates", "2"]


def _load(name: str):
    return load_script(f"scripts/benchmark/{name}.py", name)


gpu_check = _load("gpu_check")
benchmark = _load("benchmark")


def test_without_cuda_it_says_so_writes_a_report_and_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert "No CUDA device" in capsys.readouterr().out
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["cuda"] is False and report["rows"] == []
    assert "nothing was checked" in (tmp_path / "gpu_check.md").read_text()


def test_checks_pass_on_cpu_bf16_and_name_the_grn_code(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--family", "dca_k2", "--out", str(tmp_path), *TINY]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())["rows"]}
    assert set(rows) == {"transformer_preln", "dca_k2"}  # the baseline is always checked: the time ratio needs it
    assert all(r["ok"] and r["finite_loss"] and r["incremental_equals_full"] for r in rows.values())
    assert rows["dca_k2"]["grn_code"] in ("kernel", "PyTorch") and rows["transformer_preln"]["grn_code"] == "-"
    assert rows["transformer_preln"]["time_ratio"] == 1.0
    assert "| PASS |" in (tmp_path / "gpu_check.md").read_text()


def test_any_failed_check_exits_1_and_reports_fail(tmp_path, monkeypatch):
    real = gpu_check.decoding_gap
    monkeypatch.setattr(gpu_check, "decoding_gap", lambda c, b: (float("nan"), real(c, b)[1]))
    assert gpu_check.main(["--device", "cpu", "--family", "transformer_preln", "--out", str(tmp_path), *TINY]) == 1
    text = (tmp_path / "gpu_check.md").read_text()
    assert "FAILED: transformer_preln bf16" in text and "| FAIL |" in text


def test_an_exception_is_a_failed_row_not_a_crash(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gpu_check, "build_contender", broken)
    assert gpu_check.main(["--device", "cpu", "--family", "transformer_preln", "--out", str(tmp_path), *TINY]) == 1
    assert "RuntimeError: CUDA error: out of memory" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--family", "nope"], "not a registered family"),
    (["--updates", "0"], "--updates must be >= 1"),
    (["--device", "cpu", "--precision", "fp16"], "fp16 needs --device cuda"),
])  # fmt: skip
def test_bad_options_stop_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_every_family_and_the_combinations_are_checked():
    opts = gpu_check.build_parser().parse_args([])
    names = [name for name, _, _ in gpu_check.targets(opts)]
    assert names[0] == "transformer_preln" and set(benchmark.registered_families()) <= set(names)
    assert all(arch for _, arch, _ in gpu_check.targets(opts))


def test_benchmark_device_cuda_without_cuda_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    opts = benchmark.build_parser().parse_args(["--device", "cuda", "--synthetic"])
    with pytest.raises(benchmark.BenchmarkError, match="--device cuda: no CUDA device is available"):
        benchmark.resolve(opts)
    opts = benchmark.build_parser().parse_args(["--synthetic"])
    benchmark.resolve(opts)
    assert opts.precisions == ["fp32"]  # the CPU default: the report reads as it always did


def test_benchmark_reports_name_no_directory_of_the_machine():
    assert benchmark.portable_command(["--data-dir", "/somewhere/data/multi30k", "--json", str(REPO / "docs" / "b.json")]) == (
        "--data-dir <dir>/multi30k --json docs/b.json"
    )
    assert "/" not in benchmark.MULTI30K_SOURCE
    for name in ("benchmark.md", "benchmark.json"):
        text = (REPO / "docs" / name).read_text()
        assert "/work/" not in text and "/home/" not in text and "/root/" not in text


def test_the_shell_command_without_cuda_exits_0(tmp_path):
    """gpu_check.sh as a GPU machine runs it, from any directory (this machine has no CUDA)."""
    proc = run(["bash", REPO / "scripts" / "benchmark" / "gpu_check.sh", "--out", tmp_path / "report"], cwd=tmp_path,
               env={"PYTHON": sys.executable})  # fmt: skip
    assert "No CUDA device" in proc.stdout
    assert (tmp_path / "report" / "gpu_check.md").is_file() and (tmp_path / "report" / "gpu_check.json").is_file()


def test_compiled_mode_checks_the_family_with_its_layers_compiled(tmp_path):
    """--mode compiled: the same checks with the idea modules through torch.compile (the eager backend here; a GPU
    runs inductor by default), reported beside the eager row with its own time ratio. ReZero, not mHC: the
    whole check cost 21 s of CPU instead of 35 here; this checks the mode, and tests/test_compile.py traces every
    choice, mHC's carry stack and its hooks among them."""
    argv = ["--device", "cpu", "--family", "rezero", "--mode", "eager", "--mode", "compiled", "--compile-backend",
            "eager"]  # fmt: skip
    assert gpu_check.main([*argv, "--out", str(tmp_path), *TINY]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert {(r["name"], r["mode"]) for r in rows} >= {("rezero", "eager"), ("rezero", "compiled")}
    assert all(r["ok"] and r["time_ratio"] is not None for r in rows)
    assert "| compiled |" in (tmp_path / "gpu_check.md").read_text()
