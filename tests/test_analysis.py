"""The analysis tools in scripts/analysis/ at tiny sizes: each runs, writes its CSV / JSON / PNG, rejects bad options
with a message naming them, and shows the paper's qualitative claim where that is cheap to check."""

import csv
import importlib
import json
import sys

import pytest
import torch

from .forkserver import run_forked
from .helpers import train_command

TOOLS = ["grad_norms", "low_rank_residual", "grn_weights", "depth_width", "compare", "mhc_coefficients", "attnres_weights",
         "mudd_weights"]


def tool(name: str):
    return importlib.import_module(f"scripts.analysis.{name}")


def read_csv(path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def outputs(prefix, suffixes=(".csv", ".json", ".png")):
    for suffix in suffixes:
        path = prefix.parent / (prefix.name + suffix)
        assert path.is_file() and path.stat().st_size > 0, f"{path} missing"


@pytest.mark.parametrize("name", TOOLS)
def test_every_tool_has_help_naming_its_paper(name):
    text = tool(name).build_parser().format_help()
    assert "--out" in text and ("arXiv" in text or "Levine" in text or "fairseq-train" in text)


def test_scripts_run_as_files():
    # forked from tests/forkserver.py's server: still python -m's run as __main__, without the interpreter start-up
    proc = run_forked([sys.executable, "-m", "scripts.analysis.depth_width", "--budget", "85M"])
    assert "depth 23" in proc.stdout and "width 555" in proc.stdout


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("grad_norms", ["--batch-size", "0"], "--batch-size must be an integer in [1, 4096]"),
        ("grad_norms", ["--inputs", "raw", "--granularity", "sublayer"], "--inputs raw needs --granularity layer"),
        ("grad_norms", ["--arch", "no_such_arch"], "--arch no_such_arch is not a registered architecture"),
        ("low_rank_residual", ["--rank", "5", "--dim", "4"], "--rank must be smaller than --dim"),
        ("low_rank_residual", ["--lr", "0"], "--lr must be in (0, 100]"),
        ("depth_width", ["--budget", "lots"], "--budget must be a number of parameters"),
        ("depth_width", ["--budget", "1000"], "--budget must be between"),
        ("depth_width", ["--tolerance", "2"], "--tolerance must be in (0, 1]"),
        ("depth_width", ["--family", "nope"], "--family nope is not a preset family"),
        ("compare", [], "give at least one --log or --eval"),
        ("grn_weights", ["/no/such.pt"], "does not exist"),
        ("mhc_coefficients", ["/no/such.pt", "--data", "."], "does not exist"),
        ("mhc_coefficients", ["/no/such.pt", "--data", ".", "--sentences", "0"], "--sentences must be an integer in [1, 100000]"),
        ("attnres_weights", ["/no/such.pt", "--data", "."], "does not exist"),
        ("attnres_weights", ["/no/such.pt", "--data", ".", "--sentences", "-1"], "--sentences must be an integer in [1, 100000]"),
        ("mudd_weights", ["/no/such.pt", "--data", "."], "does not exist"),
        ("mudd_weights", ["/no/such.pt", "--data", ".", "--sentences", "0"], "--sentences must be an integer in [1, 100000]"),
    ],
)
def test_bad_options_are_refused_by_name(name, argv, message, capsys):
    with pytest.raises(SystemExit):
        tool(name).main(argv)
    assert message in capsys.readouterr().err


def test_grad_norms_post_ln_vanishes_pre_ln_collapses_residual_avoids_both(tmp_path):
    """ResiDual figure 2 at reduced depth: the E12D12 presets (the paper's width), its dummy batch."""
    archs = ["transformer_postln_iwslt_e12d12", "transformer_preln_iwslt_e12d12", "residual_iwslt_e12d12"]
    argv = [a for arch in archs for a in ("--arch", arch)]
    argv += ["--encoder-layers", "0", "--decoder-layers", "0", "--vocab-size", "500", "--out", str(tmp_path / "gn")]
    summary = tool("grad_norms").main(argv)
    outputs(tmp_path / "gn")
    post, pre, dual = (summary[arch]["decoder"] for arch in archs)
    assert post["points"] == 12 and summary[archs[0]]["encoder"]["points"] == 12
    assert post["grad_norm_first"] < 0.25 * post["grad_norm_last"]  # vanishes towards the input
    assert dual["grad_norm_min"] > 3 * post["grad_norm_first"]  # the dual stream keeps a lower bound
    assert pre["diff_ratio_last_to_first"] < 0.6  # Pre-LN's layer inputs stop changing
    assert dual["diff_ratio_last_to_first"] > 1.5 * pre["diff_ratio_last_to_first"]


def test_grad_norms_per_sub_block_and_against_a_direct_computation(tmp_path):
    gn = tool("grad_norms")
    gn.main(["--arch", "transformer_preln_iwslt_e6d6", "--encoder-layers", "1", "--decoder-layers", "2",
             "--batch-size", "2", "--tokens", "5", "--vocab-size", "50", "--granularity", "sublayer",
             "--out", str(tmp_path / "sub")])  # fmt: skip
    rows = list(read_csv(tmp_path / "sub.csv"))
    assert [r["sublayer"] for r in rows if r["side"] == "decoder"] == ["self_attn", "encoder_attn", "ffn"] * 2
    assert [r["sublayer"] for r in rows if r["side"] == "encoder"] == ["self_attn", "ffn"]

    # the per-layer norm equals a direct norm over the layer's parameters after the same backward pass
    args = gn.build_parser().parse_args(["--encoder-layers", "1", "--decoder-layers", "2", "--batch-size", "2",
                                         "--tokens", "5", "--vocab-size", "50"])  # fmt: skip
    rows = gn.measure("transformer_preln_iwslt_e6d6", args)
    torch.manual_seed(args.seed)
    model = tool("analysis_common").build_arch(
        "transformer_preln_iwslt_e6d6", 50, ["--dropout", "0.0", "--encoder-layers", "1", "--decoder-layers", "2"]
    ).train()
    src, lengths, prev, tgt = gn.dummy_batch(50, 2, 5, model.encoder.dictionary.nspecial, args.seed)
    logits, _ = model(src, lengths, prev)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1)).backward()
    direct = torch.cat([p.grad.double().flatten() for p in model.decoder.layers[1].parameters()]).norm().item()
    measured = next(r for r in rows if r["side"] == "decoder" and r["layer"] == 2)["grad_norm"]
    assert measured == pytest.approx(direct, rel=1e-5)


def test_low_rank_grn_v1_reaches_a_far_smaller_loss_than_resnet(tmp_path):
    """DCA figure 1 at small scale: d = 20, 4 layers of rank 1, 200 SGD steps."""
    best = tool("low_rank_residual").main(
        ["--dim", "20", "--layers", "4", "--rank", "1", "--steps", "200", "--batch-size", "50", "--lr", "0.03",
         "--lr", "0.1", "--model", "resnet", "--model", "grn-v1", "--task", "identity", "--out", str(tmp_path / "lr")]
    )  # fmt: skip
    outputs(tmp_path / "lr")
    assert best["identity/grn-v1"]["final_mse"] < 0.01 * best["identity/resnet"]["final_mse"]


def test_low_rank_networks_start_as_the_same_resnet():
    """b = 1 (and w = 0): every GRN network computes the ResNet with the same layer weights at step 0."""
    lrr = tool("low_rank_residual")
    x = torch.randn(5, 12)
    outs = []
    for grn in (None, "grn-v1", "grn-v2", "grn-v3"):
        torch.manual_seed(0)
        outs.append(lrr.LowRankNet(12, 3, 2, grn)(x))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0])


def test_depth_width_fit_reproduces_table_1(tmp_path):
    """The law recovered from table 1 gives its widths within 3% at the table's depths, and from the trained
    GPT-3 sizes its optimal depths (within 0.5 layers) and widths (within 1%)."""
    result = tool("depth_width").main(["--arch", "residual_iwslt_e36d6", "--arch", "residual_iwslt_e6d6",
                                       "--budget", "1.3B", "--out", str(tmp_path / "dw")])  # fmt: skip
    outputs(tmp_path / "dw")
    fit = result["fit"]
    assert fit["a"] == pytest.approx(5.01, abs=0.02) and fit["b"] == pytest.approx(0.0560, abs=0.0005)
    for row in result["table_1"]:
        assert abs(row["fit_width_error"]) < 0.03, row
        if "size" in row:
            assert abs(row["optimal_depth"] - row["table_depth"]) < 0.5, row
            assert abs(row["suggested_width_error"]) < 0.01, row
    for check in result["text_checks"]:  # N_transition(96), N_transition(80) inside the paper's error bars
        assert abs(check["recovered"] - check["paper"]) < check["paper_error"]
    verdicts = {r["arch"]: r["verdict"] for r in result["archs"]}
    assert verdicts["residual_iwslt_e36d6"].startswith("too deep")
    assert verdicts["residual_iwslt_e6d6"] == "near optimal"
    # non-embedding size of E6D6 at width 256: 6 encoder layers of ~12 d^2 and 6 decoder layers of ~16 d^2
    e6d6 = next(r for r in result["archs"] if r["arch"] == "residual_iwslt_e6d6")
    assert e6d6["size"] == pytest.approx(6 * 12 * 256**2 + 6 * 16 * 256**2, rel=0.02)


@pytest.fixture(scope="module")
def dca_run(corpus_bin, tmp_path_factory):
    """One short fairseq-train run of k-DCA (k = 2) with a JSON log: its checkpoint and its log."""
    save = tmp_path_factory.mktemp("dca")
    proc = run_forked(train_command(corpus_bin, save, "dca_k2_iwslt_e6d6", max_update=6,
                             extra=["--log-format", "json", "--log-interval", "2"]))  # fmt: skip
    (save / "train.log").write_text(proc.stdout + proc.stderr)
    return save / "checkpoint_last.pt", save / "train.log"


# An excerpt of a real fairseq-train log in the default (simple) format: the configuration line shortened
SIMPLE_LOG = """\
2026-11-22 08:09:22 | INFO | fairseq_cli.train | {'_name': None, 'model': Namespace(arch='transformer_preln_iwslt_e6d6', encoder_layers=6, decoder_layers=6, encoder_embed_dim=16)}
2026-11-22 08:09:22 | INFO | fairseq_cli.train | num. shared model params: 37,696 (num. trained: 37,696)
2026-11-22 08:09:24 | INFO | train_inner | epoch 001:      2 / 4 loss=7.001, nll_loss=6.995, ppl=127.53, wps=4415.7, ups=18.33, wpb=563.5, bsz=60, num_updates=2, lr=0.001, gnorm=1.42, train_wall=0, wall=2
2026-11-22 08:09:24 | INFO | train_inner | epoch 001:      4 / 4 loss=6.763, nll_loss=6.734, ppl=106.44, wps=9084.5, ups=11.09, wpb=819.5, bsz=140, num_updates=4, lr=0.001, gnorm=1.297, train_wall=0, wall=2
2026-11-22 08:09:24 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 6.553 | nll_loss 6.501 | ppl 90.57 | wps 0 | wpb 283 | bsz 40 | num_updates 4
2026-11-22 08:09:24 | INFO | train | epoch 001 | loss 6.86 | nll_loss 6.84 | ppl 114.58 | wps 6111.6 | ups 9.75 | wpb 691.5 | bsz 100 | num_updates 4 | lr 0.001 | gnorm 1.358 | train_wall 0 | wall 2
2026-11-22 08:09:25 | INFO | train_inner | epoch 002:      2 / 4 loss=6.498, nll_loss=6.438, ppl=86.72, wps=4720.6, ups=8.45, wpb=558.5, bsz=72, num_updates=6, lr=0.001, gnorm=0.823, train_wall=0, wall=2
2026-11-22 08:09:27 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.448 | nll_loss 6.384 | ppl 83.49 | wps 0 | wpb 283 | bsz 40 | num_updates 6 | best_loss 6.448
2026-11-22 08:09:27 | INFO | train | epoch 002 | loss 6.498 | nll_loss 6.438 | ppl 86.72 | wps 4653.3 | ups 8.33 | wpb 558.5 | bsz 72 | num_updates 6 | lr 0.001 | gnorm 0.823 | train_wall 0 | wall 2
2026-11-22 08:09:27 | INFO | fairseq_cli.train | done training in 0.7 seconds
"""


def test_grn_weights_reads_a_trained_dca_checkpoint(dca_run, tmp_path):
    summary = tool("grn_weights").main([str(dca_run[0]), "--out", str(tmp_path / "gw")])
    outputs(tmp_path / "gw")
    rows = list(read_csv(tmp_path / "gw.csv"))
    # DCA: q, k, v per layer, one output GRN; k = 2: layer 6 reads the embedding, the middle sum, layers 4 and 5
    assert {r["output"] for r in rows if r["grn"] != "output"} == {"q", "k", "v"}
    assert {r["output"] for r in rows if r["grn"] == "output"} == {"in"}
    labels = [r["position_label"] for r in rows if r["side"] == "encoder" and r["grn"] == "6" and r["output"] == "q"]
    assert labels == ["0", "mid", "4", "5"]
    assert summary["encoder"]["grns"] == summary["decoder"]["grns"] == 6 * 3 + 1  # the output GRN has one


def test_grn_weights_median_and_band_of_known_biases(tmp_path):
    """A state dict whose biases are known: the tool's median and 90% band are those of the d values."""
    gw = tool("grn_weights")
    model = tool("analysis_common").build_arch("dca_iwslt_e6d6", 20, ["--encoder-layers", "2", "--decoder-layers", "2",
                                               "--dca-mode", "grn-v2"])  # fmt: skip
    state = model.state_dict()
    values = torch.arange(256, dtype=torch.float)
    state["encoder.layers.1.grn.b"][0, 0] = values
    torch.save(state, tmp_path / "state.pt")
    gw.main([str(tmp_path / "state.pt"), "--side", "encoder", "--out", str(tmp_path / "gw")])
    row = next(r for r in read_csv(tmp_path / "gw.csv") if r["grn"] == "2" and r["position"] == "0")
    assert float(row["median"]) == pytest.approx(127.5)
    assert float(row["band_low"]) == pytest.approx(torch.quantile(values, 0.05).item())
    assert float(row["band_high"]) == pytest.approx(torch.quantile(values, 0.95).item())


def test_compare_reads_json_and_simple_logs_and_evaluations(dca_run, tmp_path):
    json_log, simple_log = dca_run[1], tmp_path / "simple.log"
    simple_log.write_text(SIMPLE_LOG)
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"arch": "dca_k2_iwslt_e6d6", "BLEU": {"name": "BLEU", "score": 12.5},
                                 "chrF": 40.0}) + "\n"
                     + json.dumps({"arch": "residual_iwslt_e6d6", "bleu": 13.0, "params": 1000}) + "\n")  # fmt: skip
    rows = tool("compare").main(["--log", str(json_log), "--log", f"simple={simple_log}", "--eval", str(evals),
                                 "--out", str(tmp_path / "cmp")])  # fmt: skip
    outputs(tmp_path / "cmp", (".md", ".csv", ".json", ".png"))
    by_run = {r["run"]: r for r in rows}

    dca = by_run["dca_k2_iwslt_e6d6"]  # the real JSON log, named after its architecture, with its evaluation
    params = next(line for line in json_log.read_text().splitlines() if "num. shared model params" in line)
    assert dca["params"] == int(params.split(": ")[1].split(" ")[0].replace(",", ""))
    assert (dca["encoder_layers"], dca["decoder_layers"], dca["updates"]) == (6, 6, 6)
    assert dca["tokens_per_second"] > 0 and dca["train_seconds"] is not None and dca["best_valid_loss"] > 0
    assert (dca["bleu"], dca["chrf"]) == (12.5, 40.0)

    simple = by_run["simple"]
    assert simple["arch"] == "transformer_preln_iwslt_e6d6" and simple["params"] == 37696
    assert (simple["updates"], simple["best_valid_loss"], simple["train_seconds"]) == (6, 6.448, 0.7)
    assert simple["tokens_per_second"] == pytest.approx((6111.6 + 4653.3) / 2)
    assert by_run["residual_iwslt_e6d6"]["bleu"] == 13.0 and by_run["residual_iwslt_e6d6"]["encoder_layers"] == 6

    curves = json.loads((tmp_path / "cmp.json").read_text())["curves"]
    assert [(v["updates"], v["loss"]) for v in curves["simple"]] == [(4, 6.553), (6, 6.448)]
    # wall time of a validation: the last training record's wall (2 s) + log time since it (0 s, then 2 s)
    assert [v["wall"] for v in curves["simple"]] == [2, 4]
    assert [v["updates"] for v in curves["dca_k2_iwslt_e6d6"]] == [4, 6]
    assert "| simple | `transformer_preln_iwslt_e6d6` | 6/6 | 37,696 |" in (tmp_path / "cmp.md").read_text()


def test_compare_reads_the_recipes_results(tmp_path):
    """recipes/main_job.sh's results.json and evaluate_recipe.py's results.json next to train_summary.json."""
    save = tmp_path / "checkpoints" / "residual_iwslt_e6d6"
    save.mkdir(parents=True)
    (save / "train_summary.json").write_text(json.dumps(
        {"arch": "residual_iwslt_e6d6", "parameters": 5000, "train_seconds": 90.0, "num_updates": 40,
         "valid_loss": 4.5}))  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(
        {"checkpoint": str(save / "checkpoint_best.pt"), "averages": {},
         "tests": {"test_2016_flickr": {"sentences": 1000, "bleu": 30.0, "chrf": 55.0}}}))  # fmt: skip
    (tmp_path / "main.json").write_text(json.dumps({"settings": {}, "models": [
        {"arch": "transformer_preln_iwslt_e6d6", "bleu": 29.0, "chrf": 54.0, "parameters": 4900,
         "num_updates": 42, "train_seconds": 95.0, "valid_loss": 4.6}]}))  # fmt: skip
    rows = tool("compare").main(["--eval", str(tmp_path / "eval.json"), "--eval", str(tmp_path / "main.json"),
                                 "--out", str(tmp_path / "cmp")])  # fmt: skip
    by_arch = {r["arch"]: r for r in rows}
    r = by_arch["residual_iwslt_e6d6"]
    assert (r["bleu"], r["chrf"], r["params"], r["train_seconds"], r["updates"]) == (30.0, 55.0, 5000, 90.0, 40)
    r = by_arch["transformer_preln_iwslt_e6d6"]
    assert (r["bleu"], r["params"], r["updates"], r["best_valid_loss"]) == (29.0, 4900, 42, 4.6)


def test_grad_norms_sees_dca_at_initialisation_as_its_pre_ln_baseline(tmp_path):
    """DCA starts as the Pre-LN transformer (b = 1, w = 0): the raw layer inputs (for DCA the plain sum of its
    stack) change from layer to layer exactly as the baseline's."""
    archs = ["dca_iwslt_e6d6", "transformer_preln_iwslt_e6d6"]
    tool("grad_norms").main(["--arch", archs[0], "--arch", archs[1], "--encoder-layers", "2", "--decoder-layers",
                             "3", "--batch-size", "2", "--tokens", "5", "--vocab-size", "50", "--inputs", "raw",
                             "--out", str(tmp_path / "raw")])  # fmt: skip
    rows = read_csv(tmp_path / "raw.csv")
    dca, pre = ([r["input_diff"] for r in rows if r["arch"] == arch] for arch in archs)
    assert len(dca) == 5 and [float(x or 0) for x in dca] == pytest.approx([float(x or 0) for x in pre], rel=1e-5)


def test_reports_are_written_under_a_temporary_name_and_moved_into_place(tmp_path):
    """A failed write leaves the previous report whole and no temporary file behind."""
    common = tool("analysis_common")
    out = tmp_path / "table.csv"
    common.write_csv(out, [{"a": 1, "b": 2}])
    with pytest.raises(ValueError):
        common.write_csv(out, [{"a": 1, "b": 2}, {"c": 3}])  # a row with a key the header lacks fails mid-write
    assert out.read_text().splitlines() == ["a,b", "1,2"]
    common.write_json(tmp_path / "table.json", {"x": 1})
    assert json.loads((tmp_path / "table.json").read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv", "table.json"]


@pytest.mark.parametrize("arch, n_moved, n_others", [("mhc_iwslt_e6d6", 3, 3), ("mhc_lite_iwslt_e6d6", 18, 23)])
def test_mhc_coefficients_at_initialisation_are_the_static_ones(arch, n_moved, n_others):
    """phi = 0 at initialisation: every token's H_res is the static one, whose off-diagonal row mass is
    n_moved e^-8 / (1 + n_others e^-8) (mHC: the three other streams; mHC-lite: the 18 of the 23 other
    permutations that move a given stream), H_pre = sigmoid(+-1) and, at the default start (mhc-lite's code, issue
    55), H_post = 2 sigmoid(+-1)."""
    import math

    from .helpers import build_model, random_batch

    model = build_model(arch)
    src, lengths, prev = random_batch(model)
    rows = tool("mhc_coefficients").measure(model, [{"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}])
    assert len(rows) == 6 * 2 + 6 * 3  # one unit per sublayer, cross-attention included
    e = math.exp(-8.0)
    expected = n_moved * e / (1 + n_others * e)
    for r in rows:
        assert r["offdiag_mean"] == pytest.approx(expected, rel=1e-4) and r["offdiag_max"] == pytest.approx(expected, rel=1e-4)
        assert r["post_min"] == pytest.approx(2 / (1 + math.e)) and r["post_max"] == pytest.approx(2 / (1 + math.exp(-1)))
        assert r["pre_min"] == pytest.approx(1 / (1 + math.e)) and r["pre_max"] == pytest.approx(1 / (1 + math.exp(-1)))
    with pytest.raises(ValueError, match="no mHC or mHC-lite unit"):
        tool("mhc_coefficients").measure(build_model("transformer_preln_iwslt_e6d6"), [])


def test_mhc_coefficients_reads_a_trained_checkpoint(corpus_bin, tmp_path):
    save = tmp_path / "mhc"
    run_forked(train_command(corpus_bin, save, "mhc_iwslt_e6d6", max_update=3))
    summary = tool("mhc_coefficients").main([str(save / "checkpoint_last.pt"), "--data", str(corpus_bin),
                                             "--sentences", "5", "--out", str(tmp_path / "mc")])  # fmt: skip
    outputs(tmp_path / "mc")
    assert summary["units"] == 30 and summary["sentences"] == 5 and 0 < summary["offdiag_mean_over_units"] < 0.75
    rows = read_csv(tmp_path / "mc.csv")
    assert rows[0]["unit"].startswith("encoder.layers.0.") and rows[-1]["unit"].startswith("decoder.layers.5.")


def attnres_sources(index: int, sublayers: int, block: int) -> int:
    """How many sources query ``index`` (0-based; ``sublayers`` = the stack output's) reads: b_0 and the completed
    blocks, and the partial sum inside a block (Full AttnRes, block 1: the embedding and every earlier output)."""
    return 1 + index // block + (index % block != 0)


@pytest.mark.parametrize("arch, block", [("attnres_iwslt_e6d6", 1), ("attnres_block_iwslt_e6d6", 6)])
def test_attnres_weights_at_initialisation_are_uniform(arch, block):
    """Zero pseudo-queries (the paper's section 5): every query averages its sources, so each weight is 1/n, the
    entropy ratio is 1 and the summary's embedding and newest weights equal the uniform one."""
    from .helpers import build_model, random_batch

    model = build_model(arch)
    src, lengths, prev = random_batch(model)
    rows = tool("attnres_weights").measure(model, [{"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}])
    assert [(r["stack"], r["query"]) for r in rows] == [("encoder", q) for q in [*range(1, 13), "out"]] + [
        ("decoder", q) for q in [*range(1, 19), "out"]
    ]
    for r in rows:
        sublayers = 12 if r["stack"] == "encoder" else 18
        index = sublayers if r["query"] == "out" else r["query"] - 1
        assert r["sources"] == attnres_sources(index, sublayers, block) and r["block_size"] == block
        assert r["weights"] == pytest.approx([1 / r["sources"]] * r["sources"], abs=1e-6)
        assert r["entropy_ratio"] == pytest.approx(1.0, abs=1e-6)  # float32 weights
    for s in tool("attnres_weights").summary(rows).values():
        assert s["embedding"] == pytest.approx(s["uniform"]) and s["newest"] == pytest.approx(s["uniform"])
    with pytest.raises(ValueError, match="no Attention Residuals"):
        tool("attnres_weights").measure(build_model("transformer_preln_iwslt_e6d6"), [])


def test_attnres_weights_reads_a_trained_checkpoint(corpus_bin, tmp_path):
    save = tmp_path / "attnres"
    run_forked(train_command(corpus_bin, save, "attnres_block_iwslt_e6d6", max_update=3))
    result = tool("attnres_weights").main([str(save / "checkpoint_last.pt"), "--data", str(corpus_bin),
                                           "--sentences", "5", "--out", str(tmp_path / "aw")])  # fmt: skip
    outputs(tmp_path / "aw")
    assert result["sentences"] == 5 and list(result["stacks"]) == ["encoder", "decoder"]
    for s in result["stacks"].values():
        assert 0 < s["entropy_ratio"] <= 1 + 1e-6 and 0 < s["embedding"] < 1
    rows = read_csv(tmp_path / "aw.csv")
    assert len(rows) == 13 + 19 and rows[-1]["query"] == "out" and "weights" not in rows[0]
    per_query = json.loads((tmp_path / "aw.json").read_text())["per_query"]
    assert all(sum(r["weights"]) == pytest.approx(1, abs=1e-5) for r in per_query)
    assert all(sum(r["shares"]) == pytest.approx(1, abs=1e-5) for r in per_query)
    assert all(0 < s["embedding_share"] <= 1 for s in result["stacks"].values())


@pytest.mark.parametrize("block_size", [1, 3])
def test_attnres_weights_and_shares_against_float64(block_size):
    """Per query, the tool's mean alpha and norm-weighted share (alpha_i ||v_i|| / sum_j alpha_j ||v_j|| per token)
    equal the paper's eq. 2-3 and the sources' norms computed directly, with trained (random) pseudo-queries."""
    from fairseq_plugins.modules.attn_res import AttentionResiduals

    from .new_ideas_common import DIM, branch, branch_weights, random_input, randomize_
    from .test_new_attn_res import L, direct_alpha

    ar = AttentionResiduals(DIM, L, block_size).double()
    randomize_(ar, scale=1.0)
    holder = torch.nn.Module()
    holder.stack = torch.nn.Module()
    holder.stack.attn_res = ar
    collector = tool("attnres_weights").Collector(holder)
    q, g, weights, x = ar.queries.detach(), ar.key_gains.detach(), branch_weights(L), random_input(4, 2, DIM)
    expected = []
    with torch.no_grad():
        state = ar.start(x)
        blocks, partial = [x], []
        for l in range(L + 1):
            sources = blocks + ([sum(partial)] if partial else [])
            alpha = direct_alpha(q, g, l, sources).reshape(len(sources), -1).t()  # (tokens, sources)
            norms = torch.stack([v.reshape(-1, DIM).norm(dim=-1) for v in sources], -1)
            share = alpha * norms / (alpha * norms).sum(-1, keepdim=True)
            expected.append((alpha.mean(0), share.mean(0)))
            if l == L:
                ar.finish(state)
                break
            partial.append(ar(l, state, lambda h, w=weights[l]: branch(h, w)))
            if len(partial) == block_size:
                blocks, partial = blocks + [sum(partial)], []
    rows = collector.rows()
    collector.close()
    assert [r["query"] for r in rows] == [*range(1, L + 1), "out"]
    for r, (alpha, share) in zip(rows, expected, strict=True):
        assert r["weights"] == pytest.approx(alpha.tolist(), abs=2e-6)
        assert r["shares"] == pytest.approx(share.tolist(), abs=2e-6)
        assert r["embedding_share"] == pytest.approx(share[0].item()) and r["newest_share"] == pytest.approx(share[-1].item())


def test_mudd_weights_at_initialisation_read_the_current_output():
    """The training code's init (W2 = 0, a_i = 1 at j = i): every way of every connection is X_i, so the current
    weight is 1, the embedding's and earlier outputs' weight and share 0, and the weights do not vary by token."""
    from .helpers import build_model, random_batch

    model = build_model("mudd_iwslt_e6d6")
    src, lengths, prev = random_batch(model)
    rows = tool("mudd_weights").measure(model, [{"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}])
    per_stack = [(c, w) for c in range(1, 6) for w in "QKVR"] + [("out", "R")]
    assert [(r["stack"], r["connection"], r["way"]) for r in rows] == [
        (stack, c, w) for stack in ("encoder", "decoder") for c, w in per_stack
    ]
    for r in rows:
        expected = [0.0] * (r["sources"] - 1) + [1.0]
        assert r["weights"] == pytest.approx(expected, abs=1e-6) and r["current"] == pytest.approx(1.0)
        assert r["embedding"] == r["older_abs"] == r["older_share"] == 0.0 and r["token_std"] == pytest.approx(0, abs=1e-6)
    for ways in tool("mudd_weights").summary(rows).values():
        assert list(ways) == ["Q", "K", "V", "R"] and ways["R"]["connections"] == 6
    with pytest.raises(ValueError, match="no MUDD connections"):
        tool("mudd_weights").measure(build_model("transformer_preln_iwslt_e6d6"), [])


def test_mudd_weights_against_float64():
    """Per connection and way, the tool's mean A, its spread over tokens, the weight on earlier outputs and their
    norm-weighted share equal eq. 5's A_i = GELU(RMSNorm(X_i) W1) W2 + a_i computed per token in float64, with
    trained (random) parameters."""
    import torch.nn.functional as F

    from fairseq_plugins.modules.muddformer import MultiwayDenseConnections

    from .new_ideas_common import DIM, random_input, randomize_
    from .test_new_muddformer import L, block, layer_weights

    mudd = MultiwayDenseConnections(DIM, L).double()
    randomize_(mudd)
    holder = torch.nn.Module()
    holder.stack = torch.nn.Module()
    holder.stack.mudd = mudd
    collector = tool("mudd_weights").Collector(holder)
    weights, x = layer_weights(L), random_input(3, 2, DIM)
    expected = []
    with torch.no_grad():
        state, ways = mudd.start(x)
        outs = [x]
        for i in range(1, L + 1):
            out = block(ways, weights[i - 1])
            outs.append(out)
            conn = mudd.connections[i - 1]
            tokens = [(t, b) for t in range(x.shape[0]) for b in range(x.shape[1])]
            a = torch.stack([(F.gelu((outs[i][t, b] / torch.sqrt((outs[i][t, b] ** 2).mean() + 1e-6)) @ conn.w1) @ conn.w2)
                             .view(conn.ways, i + 1) + conn.static for t, b in tokens])  # (tokens, ways, sources)
            norms = torch.stack([torch.stack([outs[j][t, b].norm() for j in range(i + 1)]) for t, b in tokens])
            weighted = a.abs() * norms.unsqueeze(1)
            expected.append((a.mean(0), a.std(0, unbiased=False), a[..., :i].abs().sum(-1).mean(0),
                             (weighted[..., :i].sum(-1) / weighted.sum(-1)).mean(0)))  # fmt: skip
            ways = mudd(i, state, out)
    rows = collector.rows()
    collector.close()
    assert [(r["connection"], r["way"]) for r in rows] == [(c, w) for c in range(1, L) for w in "QKVR"] + [("out", "R")]
    for r in rows:
        i = L if r["connection"] == "out" else r["connection"]
        c = "QKVR".index(r["way"]) if i < L else 0
        mean, std, older, share = (e[c] for e in expected[i - 1])
        assert r["weights"] == pytest.approx(mean.tolist(), abs=2e-6)
        assert r["token_stds"] == pytest.approx(std.tolist(), abs=2e-6)
        assert r["older_abs"] == pytest.approx(older.item()) and r["older_share"] == pytest.approx(share.item())
        assert r["current"] == pytest.approx(mean[i].item()) and r["embedding"] == pytest.approx(mean[0].item())
    assert "forward" not in mudd.connections[0].__dict__  # close() unwrapped the connections


def test_mudd_weights_reads_a_trained_checkpoint(corpus_bin, tmp_path):
    save = tmp_path / "mudd"
    run_forked(train_command(corpus_bin, save, "mudd_iwslt_e6d6", max_update=3))
    result = tool("mudd_weights").main([str(save / "checkpoint_last.pt"), "--data", str(corpus_bin),
                                        "--sentences", "5", "--out", str(tmp_path / "mw")])  # fmt: skip
    outputs(tmp_path / "mw")
    assert result["sentences"] == 5 and list(result["stacks"]) == ["encoder", "decoder"]
    rows = read_csv(tmp_path / "mw.csv")
    assert len(rows) == 2 * (5 * 4 + 1) and rows[-1]["connection"] == "out" and "weights" not in rows[0]
    per_connection = json.loads((tmp_path / "mw.json").read_text())["per_connection"]
    assert all(len(r["weights"]) == r["sources"] and 0 <= r["older_share"] <= 1 for r in per_connection)
