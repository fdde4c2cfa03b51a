"""scripts/benchmark/benchmark.py, the speed comparison with fairseq's transformer: its report's structure, its
targets and verdicts, its groups and merges, its compiled columns, and every family measured at tiny size. No timed
assertion (speed is the benchmark's to print, not a test's to judge: a gross slowdown shows in its report and in
``python -m scripts.benchmark.before_after``). Families are discovered from the preset table, so a family added
later is measured as soon as it registers; CI measures every family but those whose settings other measured
families all hold (tests/grid_sample.py: such a family runs no module of its own), ALL_FAMILIES=1 every family.
"""

import json

import pytest
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from fairseq_plugins.axes import AGGREGATES, KEEPS_PACE, declarations
from fairseq_plugins.models.families import NEW_IDEAS
from scripts.benchmark.bench_families import namespace_to_config
from scripts.study.study_common import git_commit

from .grid_sample import choice_families
from .helpers import REPO, load_script

# one round without warm-up of the smallest models: what the report holds, not how fast anything is
STRUCTURE = [
    "--synthetic", "--depth", "e6d6", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--threads", "1",
    "--rounds", "1", "--warmup", "0", "--max-tokens", "1024", "--train-batches", "1", "--vocab-size", "512",
    "--decode-sentences", "2", "--decode-batch-size", "2", "--decode-len", "6", "--peak-repeats", "0",
    "--no-memory", "--no-flop-count", "--quiet",
]  # fmt: skip


def _load_benchmark():
    return load_script("scripts/benchmark/benchmark.py", "benchmark")


benchmark = _load_benchmark()
REGISTERED = [f for f in benchmark.registered_families() if f"{f}_iwslt_e6d6" in benchmark.PRESETS]
# every family but a combination of choices that other measured families hold (tests/grid_sample.py)
FAMILIES = choice_families(f for f in REGISTERED if f != "transformer_postln")


def test_every_family_is_measured_against_fairseqs_transformer():
    """Each family builds, trains and decodes in the benchmark's line-up beside the baseline, with a ratio for
    each metric (their values are the report's, not the test's)."""
    argv = [*STRUCTURE, "--group-size", "1000", *(a for f in FAMILIES for a in ("--family", f))]
    opts = benchmark.build_parser().parse_args(argv)
    benchmark.resolve(opts)
    report = benchmark.run_benchmark(opts, benchmark.synthetic_corpus(n_train=1000, n_test=16))
    (result,) = report["results"]  # one line-up: every family against one baseline (tiny models fit in memory)
    assert list(result["families"]) == FAMILIES
    for family, row in result["families"].items():
        assert row["train_ratio"]["median"] > 0 and row["decode_ratio"]["median"] > 0, family


def test_only_throughput_misses_are_profiled():
    """--profile misses explains throughput misses; a memory ratio (one number, no rounds) is never profiled."""
    row = {"train_ratio": {"median": 0.5}, "decode_ratio": {"median": 0.99}, "memory_ratio": 2.0}
    assert benchmark.missed_metrics("dca", "e18d18", row) == ["train"]
    assert benchmark.missed_metrics("dca", "e6d6", row) == []  # its training targets are at E12D12, E18D18 only


def _ratio(median: float, low: float, high: float) -> dict:
    return {"median": median, "min": low, "max": high, "cpu": median, "best": median}


def test_target_table_has_a_verdict_and_mfu_per_target_of_issue_15():
    """The targets of issue 15, item 1, each with a verdict; training targets carry both MFUs."""
    wanted = {("dca_k2", "train", ">=", 0.95, None), ("dca_k2", "decode", ">=", 0.95, None),
              ("dca_k2", "memory", "<=", 1.10, None), ("dca", "train", ">=", 0.90, "e12d12"),
              ("dca", "train", ">=", 0.85, "e18d18"), ("dca", "decode", ">=", 0.90, None),
              ("crossformer_hg", "memory", "<", 1.00, None)}  # fmt: skip
    wanted |= {(f, m, ">=", 0.98, None) for f in ("crossformer_hg", "crossformer_sg", "residual") for m in ("train", "decode")}
    have = {(t.family, t.metric, t.op, t.bound, t.depth) for t in benchmark.TARGETS}
    assert wanted <= have
    base = {"model_tflops_per_s": {"median": 0.050}}
    row = {"train_ratio": _ratio(0.96, 0.93, 0.99), "decode_ratio": _ratio(0.90, 0.88, 0.92), "memory_ratio": 1.0,
           "model_tflops_per_s": {"median": 0.048}}  # fmt: skip
    results = [{"depth": "e18d18", "layers": [18, 18], "baseline": base, "families": {"dca_k2": row}}]
    verdicts = {(v["target"].metric, v["depth"]): v for v in benchmark.check_targets(results)}
    assert verdicts["train", "e18d18"]["pass"] and not verdicts["train", "e18d18"]["settled"]
    assert not verdicts["decode", "e18d18"]["pass"] and verdicts["decode", "e18d18"]["settled"]
    assert verdicts["memory", "e18d18"]["pass"]
    assert verdicts["train", "e18d18"]["model_tflops_per_s"] == [0.048, 0.050]
    report = {"machine": {"cpu": "x", "cpus": 2, "torch": "t", "matmul_peak_gflops": 100.0},
              "settings": {"rounds": 3, "width": "256", "threads": 1, "train_batches": 2, "max_tokens": 1024,
                           "beam": 5, "decode_sentences": 32, "decode_len": 16, "profile_repeats": 1},
              "corpus": "c", "results": [], "not_benchmarked": {},
              "targets": [dict(v, target=vars(v["target"])) for v in verdicts.values()]}  # fmt: skip
    text = benchmark.markdown(report)
    assert "| `dca_k2` train >= 0.95 | e18d18 | 0.96 | 48.0% (50.0%) | PASS (within spread) |" in text
    assert "| `dca_k2` decode >= 0.95 | e18d18 | 0.90 | - | FAIL |" in text


def test_issue_27_speed_targets_cover_every_new_idea_and_aggregation_family():
    """Issue 27, item 3: >= 0.97 at every depth for the ideas without matmuls, >= 0.90 at E12D12 for aggregation:
    every choice's declared speed bounds are targets of its preset, and every 2024-26 idea declares one class."""
    have = {(t.family, t.metric, t.op, t.bound, t.depth) for t in benchmark.TARGETS}
    tables = declarations()
    for table in tables.values():
        for choice in table.values():
            want = {(choice.preset, s.metric, s.op, s.bound, s.depth) for s in choice.speed}
            assert want <= have, choice.label()
    for prefix, settings in NEW_IDEAS.items():
        chosen = [tables[option][value] for option, value in settings.items() if option in tables]
        assert any(c.speed in (KEEPS_PACE, AGGREGATES) for c in chosen), prefix
    assert {t.family for t in benchmark.TARGETS} <= set(REGISTERED)


def test_the_report_is_moved_into_place_only_when_written_whole(tmp_path):
    out = tmp_path / "benchmark.md"
    benchmark.write_report(out, "old\n")
    with pytest.raises(TypeError):
        benchmark.write_report(out, None)
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["benchmark.md"]


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """A run of three families in groups of two (the merge test's first run too): its exit status and JSON."""
    out = tmp_path_factory.mktemp("grouped") / "r.json"
    argv = [*STRUCTURE, "--group-size", "2",
            "--family", "residual", "--family", "dca", "--family", "rezero", "--json", str(out)]
    return benchmark.main(argv), out


def test_families_are_measured_in_groups_each_against_its_own_baseline(grouped):
    """--group-size bounds the models alive at once (every family at E12D12 in one line-up took 19 GB)."""
    status, out = grouped
    assert status == 0
    report = json.loads(out.read_text())
    assert [(r["depth"], r["group"], list(r["families"])) for r in report["results"]] == [
        ("e6d6", 1, ["residual", "dca"]), ("e6d6", 2, ["rezero"])]
    assert all(r["baseline"]["train_tokens_per_s"]["median"] > 0 for r in report["results"])
    text = benchmark.markdown(report)
    assert "`transformer_preln` (group 1)" in text and "`transformer_preln` (group 2)" in text
    # the code measured: this checkout's commit, named in the report's header
    assert report["machine"]["commit"] == git_commit(REPO)
    assert f"Code: commit {git_commit(REPO)[:7]}" in text
    assert {v["target"]["family"] for v in report["targets"]} == {"residual", "dca", "rezero"}


def test_runs_merge_into_one_report_as_groups_and_mismatches_are_refused(grouped, tmp_path, capsys):
    """The grouped run above (its group size is free to differ) and a run of one more family merge as the groups
    of one run."""
    merge = load_script("scripts/benchmark/bench_merge.py", "bench_merge")
    (tmp_path / "a.json").write_bytes(grouped[1].read_bytes())
    assert benchmark.main([*STRUCTURE, "--family", "layerscale", "--json", str(tmp_path / "b.json")]) == 0
    out = tmp_path / "merged.json"
    assert merge.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [(r["group"], list(r["families"])) for r in merged["results"]] == [
        (1, ["residual", "dca"]), (2, ["rezero"]), (3, ["layerscale"])]
    assert {v["target"]["family"] for v in merged["targets"]} == {"residual", "dca", "rezero", "layerscale"}
    assert merged["command"].count("scripts.benchmark.benchmark") == 2
    assert merged["machine"]["commits"] == [git_commit(REPO)]  # both runs' code, once
    other = json.loads((tmp_path / "b.json").read_text())
    other["settings"]["rounds"] = 5
    (tmp_path / "c.json").write_text(json.dumps(other))
    (tmp_path / "d.json").write_text(json.dumps({"settings": other["settings"] | {"rounds": 1}, "results": [{}],
                                                 "machine": {}}))
    for bad, message in ((["a.json", "c.json"], "setting rounds is 5"), (["a.json", "a.json"], "dca, residual, rezero: measured in more"),
                         (["a.json", "missing.json"], "not a readable JSON report"), (["a.json", "d.json"], "not a complete")):
        with pytest.raises(SystemExit) as exit_:
            merge.main([str(tmp_path / name) for name in bad])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_compiled_is_measured_beside_eager_in_one_run(tmp_path):
    """--compiled: every line-up once more with its layers compiled (issue 58), each against the baseline compiled
    alike, in the report's precision table beside the eager columns."""
    argv = [*STRUCTURE, "--family", "mhc", "--no-decode",
            "--compiled", "--compile-backend", "eager", "--json", str(tmp_path / "r.json")]  # fmt: skip
    assert benchmark.main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["precisions"] == ["fp32", "fp32+compiled"]
    (result,) = report["results"]
    compiled = result["other_precisions"]["fp32+compiled"]
    assert compiled["baseline"]["train_tokens_per_s"]["median"] > 0 and "train_ratio" in compiled["families"]["mhc"]
    assert "fp32+compiled train tok/s (ratio)" in benchmark.markdown(report)
    with pytest.raises(SystemExit):
        benchmark.main(["--task", "lm", "--compiled", "--synthetic"])


def _plain(node):
    """A config as plain values, a Namespace as its sorted items, each leaf with its type."""
    from argparse import Namespace

    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        return {k: _plain(node[k]) for k in node}
    if isinstance(node, Namespace):
        return sorted((k, repr(v)) for k, v in vars(node).items())
    if isinstance(node, (list, ListConfig)):
        return [_plain(v) for v in node]
    return type(node).__name__, node


def test_each_contender_gets_fairseqs_own_config(tmp_path):
    """bench_families.namespace_to_config composes hydra's config once per set of overrides (the same for a
    line-up's models but one with its own criterion): each model's config is still exactly fairseq's
    convert_namespace_to_omegaconf of its own arguments (its arch, its options, its criterion)."""
    def parsed(arch, *extra):
        argv = [str(tmp_path), "--task", "translation", "--arch", arch, "--optimizer", "adam", "--lr-scheduler",
                "inverse_sqrt", "--criterion", "label_smoothed_cross_entropy", "--cpu", *extra]  # fmt: skip
        return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)

    guided = ["--criterion", "label_smoothed_cross_entropy_with_guidance"]
    for args in (parsed("transformer_preln_e6d6"), parsed("residual_e6d6", "--dual-residual-scale", "0.5"),
                 parsed("crossformer_sg_e6d6", *guided)):  # fmt: skip
        got, want = namespace_to_config(args), convert_namespace_to_omegaconf(args)
        assert _plain(got) == _plain(want), args.arch
        assert OmegaConf.is_struct(got)
