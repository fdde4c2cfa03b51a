"""scripts/benchmark/benchmark.py --task lm (issue 28, item 5): the language-model presets against fairseq's own
transformer LM of the same shape, in a tiny run (no timed assertions: rows, finite ratios, the report's text);
and the translation default, whose committed report must still be what the code writes from its JSON."""

import json
import math

import pytest

from .helpers import REPO, load_script

FAMILIES = ("transformer_preln", "dca", "hc_dynamic")
TINY = [
    "--task", "lm", "--synthetic", "--depth", "d6", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2",
    "--tokens-per-sample", "16", "--max-tokens", "64", "--train-batches", "1", "--rounds", "2", "--warmup", "1",
    "--vocab-size", "128", "--decode-sentences", "4", "--decode-batch-size", "4", "--decode-len", "3",
    "--lm-prefix-len", "4", "--beam", "2", "--peak-repeats", "0", "--quiet",
]  # fmt: skip


def _load_benchmark():
    return load_script("scripts/benchmark/benchmark.py", "benchmark")


benchmark = _load_benchmark()


@pytest.fixture(scope="module")
def lm_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_bench")
    argv = [*TINY, *(a for f in FAMILIES for a in ("--family", f)), "--json", str(out / "r.json"),
            "--markdown", str(out / "r.md")]  # fmt: skip
    assert benchmark.main(argv) == 0
    return json.loads((out / "r.json").read_text()), (out / "r.md").read_text()


def _finite_ratio(cell: dict) -> bool:
    return all(math.isfinite(cell[k]) and cell[k] > 0 for k in ("median", "min", "max", "best", "cpu"))


def test_lm_run_has_a_row_per_family_against_fairseqs_transformer_lm(lm_report):
    report, text = lm_report
    assert report["settings"]["task"] == "lm" and report["targets"] == []
    (res,) = report["results"]
    assert res["depth"] == "d6" and res["layers"] == [0, 6] and res["embed_dim"] == 16
    assert res["baseline_name"] == "fairseq transformer_lm" and res["baseline_arch"] == "transformer_lm_big"
    assert list(res["families"]) == list(FAMILIES)
    base_params = res["baseline"]["parameters"]
    for family, row in res["families"].items():
        assert row["arch"] == f"{family}_lm_d6"
        assert _finite_ratio(row["train_ratio"]) and _finite_ratio(row["decode_ratio"]), family
        assert math.isfinite(row["memory_ratio"]) and row["memory_ratio"] > 0
        assert row["counted_matmul_flops_per_step"] > 0 and row["model_flops_per_target_token"] > 0
        assert len(row["train_seconds"]) == len(row["decode_seconds"]) == 2
    # the plugin's Pre-LN LM is fairseq's model: same parameters, same matmul work
    control = res["families"]["transformer_preln"]
    assert control["parameters"] == base_params
    assert control["counted_matmul_flops_per_step"] == res["baseline"]["counted_matmul_flops_per_step"]
    assert "| D6 | `fairseq transformer_lm` | 1 | 1 | 1 |" in text
    assert all(f"| D6 | `{f}` | **" in text for f in FAMILIES)
    assert "Pre-LN with a final LayerNorm" in text and "prefixes of 4 tokens continued by exactly 3 tokens" in text
    assert "/work/" not in text and "--task lm" in report["command"]


def test_the_lm_baseline_is_pre_ln_with_a_final_layer_norm(tmp_path):
    """fairseq's transformer_lm_big reshaped: Pre-LN layers and a final LayerNorm (base_lm_architecture)."""
    from fairseq.data import Dictionary

    from scripts.benchmark import bench_lm

    opts = benchmark.build_parser().parse_args([*TINY, "--family", "dca"])
    benchmark.resolve(opts)
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    d.save(str(tmp_path / "dict.txt"))
    opts.lm_layers = {bench_lm.LM_BASELINE_ARCH: 2}
    c = bench_lm.build_lm_contender(bench_lm.LM_BASELINE, bench_lm.LM_BASELINE_ARCH, tmp_path, opts)
    decoder = c.trainer.model.decoder
    assert type(c.trainer.model).__name__ == "TransformerLanguageModel"
    assert len(decoder.layers) == 2 and decoder.embed_dim == 16 and decoder.layer_norm is not None
    assert all(layer.normalize_before for layer in decoder.layers)


@pytest.mark.parametrize("extra, message", [
    (["--depth", "e6d6"], "--depth e6d6: not an LM depth"),
    (["--family", "nope"], "--family nope: no language model"),
    (["--profile", "all"], "--profile"),
    (["--lm-prefix-len", "14"], "--lm-prefix-len 14"),
])  # fmt: skip
def test_lm_option_errors_name_the_option(extra, message):
    opts = benchmark.build_parser().parse_args([*TINY, *extra])
    with pytest.raises(benchmark.BenchmarkError, match=message):
        benchmark.resolve(opts)


def test_translation_default_unchanged():
    """The default task is translation, and the committed report is what markdown() writes from its JSON."""
    assert benchmark.build_parser().parse_args([]).task == "translation"
    report = json.loads((REPO / "docs" / "benchmark.json").read_text())
    assert benchmark.markdown(report) == (REPO / "docs" / "benchmark.md").read_text()


def test_committed_lm_report_is_what_its_json_gives():
    report = json.loads((REPO / "docs" / "benchmark_lm.json").read_text())
    text = (REPO / "docs" / "benchmark_lm.md").read_text()
    assert benchmark.markdown(report) == text
    assert report["settings"]["task"] == "lm" and report["settings"]["width"].startswith("512/2048/8")
    for bad in ("/work/", "/home/", "/root/", "/tmp/"):
        assert bad not in text and bad not in json.dumps(report)
