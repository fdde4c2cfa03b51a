"""Run fairseq's translation test cases for one architecture in one process, as fairseq's own tests/utils.py
does (its ``train_translation_model`` / ``generate_main`` call the CLI mains in-process): train a tiny model,
then generate, sample, decode with diverse beams, prefixes and constraints, translate interactively,
validate, and prune layers at load time and in training. Each case's outcome is written to a JSON file
that tests/test_fairseq_parity.py checks.

    python -m tests.parity_driver DATA WORK_DIR ARCH OUT.json CASE[,CASE...]
"""

import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

from .helpers import PLUGIN_DIR, TINY, family_train_args

SHAPE = ["--encoder-layers", "3", "--decoder-layers", "3"]
PRUNE = "{'encoder_layers_to_keep': '0,2', 'decoder_layers_to_keep': '1'}"


def train_args(data: Path, save_dir: Path, arch: str, extra=()) -> list[str]:
    # fairseq's test_transformer_layerdrop trains with LayerDrop before pruning; DCA refuses LayerDrop
    layerdrop = [] if arch.startswith("dca") else ["--encoder-layerdrop", "0.01", "--decoder-layerdrop", "0.01"]
    return [
        str(data), "--user-dir", str(PLUGIN_DIR), "--arch", arch, *TINY, *SHAPE, "--cpu", "--seed", "1",
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", "--max-update", "2",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", *family_train_args(arch),
        "--save-dir", str(save_dir), "--no-progress-bar", "--log-format", "json", "--no-epoch-checkpoints",
        "--no-save-optimizer-state", "--num-workers", "0", "--disable-validation", *layerdrop, *extra,
    ]  # fmt: skip


def cases(data: Path, work: Path, arch: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (fairseq tool, its arguments); run in this order (prune_train_generate needs prune_train)."""
    checkpoint = str(work / "checkpoint_last.pt")
    common = [str(data), "--user-dir", str(PLUGIN_DIR), "--path", checkpoint, "--cpu", "--num-workers", "0",
              "--required-batch-size-multiple", "1"]  # fmt: skip
    gen = [*common, "--max-len-b", "5", "--batch-size", "64"]
    interactive = [*common, "--source-lang", "src", "--target-lang", "tgt", "--buffer-size", "4", "--max-len-b", "8",
                   "--input", str(work / "input.txt")]  # fmt: skip
    return {
        # fairseq's test_generation flags: beam + nbest + alignments, then its sampling, prefix, diverse beam
        "beam": ("generate", [*gen, "--beam", "3", "--nbest", "3", "--print-alignment"]),
        "sampling": ("generate", [*gen, "--beam", "2", "--nbest", "2", "--sampling", "--sampling-topk", "3",
                                  "--seed", "1"]),
        "sampling_topp": ("generate", [*gen, "--beam", "2", "--nbest", "2", "--sampling", "--sampling-topp", "0.2"]),
        "prefix": ("generate", [*gen, "--beam", "2", "--prefix-size", "2"]),
        "diverse_beam": ("generate", [*gen, "--beam", "4", "--diverse-beam-groups", "2"]),
        "diverse_beam_batches": ("generate", [*common, "--max-len-b", "5", "--batch-size", "8", "--beam", "4",
                                              "--diverse-beam-groups", "2"]),
        "constraints": ("interactive", [*interactive, "--beam", "4", "--nbest", "2", "--constraints", "ordered"]),
        "score_reference_interactive": ("interactive", [*interactive, "--score-reference"]),
        "validate": ("validate", [str(data), "--user-dir", str(PLUGIN_DIR), "--path", checkpoint, "--cpu",
                                  "--task", "translation", "--num-workers", "0", "--max-tokens", "1000",
                                  "--valid-subset", "valid"]),
        # fairseq's test_transformer_layerdrop: prune at load time, both sides, then one side only
        "prune_load": ("generate", [*gen, "--beam", "2", "--model-overrides", PRUNE]),
        "prune_load_encoder": ("generate", [*gen, "--beam", "2", "--model-overrides",
                                            "{'encoder_layers_to_keep': '1'}"]),
        # prune in training: continue from the full checkpoint with the kept layers only
        "prune_train": ("train", train_args(data, work / "pruned", arch, [
            "--restore-file", checkpoint, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
            "--max-update", "1", "--encoder-layers-to-keep", "0,2", "--decoder-layers-to-keep", "1"])),
        "prune_train_generate": ("generate", [*gen, "--beam", "2", "--path", str(work / "pruned/checkpoint_last.pt")]),
    }


def run_tool(tool: str, argv: list[str]) -> dict:
    """Run a fairseq CLI main in this process; return its stdout, or the error it ended with."""
    import fairseq_cli.generate
    import fairseq_cli.interactive
    import fairseq_cli.train
    import fairseq_cli.validate

    main = {"train": fairseq_cli.train.cli_main, "generate": fairseq_cli.generate.cli_main,
            "interactive": fairseq_cli.interactive.cli_main, "validate": fairseq_cli.validate.cli_main}[tool]  # fmt: skip
    sys.argv = [f"fairseq-{tool}", *argv]
    out = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            main()
    except (Exception, SystemExit) as err:  # noqa: BLE001 - every failure is an outcome to report
        message = f"{type(err).__name__}: {err}"
        return {"ok": False, "error": message[-2000:], "trace": traceback.format_exc()[-3000:],
                "stdout": out.getvalue()[-3000:], "seconds": time.perf_counter() - start}  # fmt: skip
    return {"ok": True, "stdout": out.getvalue(), "seconds": time.perf_counter() - start}


def main(data: str, work: str, arch: str, out: str, names: str) -> None:
    data, work = Path(data), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    # interactive input: source sentences, with a tab-separated constraint for --constraints
    (work / "input.txt").write_text("w1 w2 w3\tW3\nw4 w5 w6 w7\tW7 W6\nw8\tW8\n")
    results = {"train": run_tool("train", train_args(data, work, arch))}
    if results["train"]["ok"]:
        for name, (tool, argv) in cases(data, work, arch).items():
            if name in names.split(","):
                results[name] = run_tool(tool, argv)
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
