"""scripts/training/retrofit_dca.py (the paper's table 4, retrofitting): a Pre-LN checkpoint becomes a DCA checkpoint
whose fairseq-generate output is the same, training continues from it, and bad inputs are refused clearly."""

import fractions
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_plugins.models.families import ALIASES

from .forkserver import run_forked
from .helpers import (
    REPO,
    generate_command,
    hypotheses,
    load_script,
    train_command,
    train_log,
)

SCRIPT = REPO / "scripts" / "training" / "retrofit_dca.py"
SHAPE = ["--encoder-layers", "4", "--decoder-layers", "3"]


@pytest.fixture(scope="module")
def retrofit_module():
    """The script as a module, to run its command line (main) in-process: importing fairseq in a new process
    is the slow part of running it."""
    return load_script(str(SCRIPT.relative_to(REPO)), "retrofit_dca")


@pytest.fixture(scope="module")
def preln_checkpoint(corpus_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("preln")
    run_forked(train_command(corpus_bin, save_dir, "transformer_preln_e6d6", max_update=2, extra=SHAPE))
    return save_dir / "checkpoint_last.pt"


def test_retrofitted_checkpoint_translates_identically_and_trains_on(
    retrofit_module, preln_checkpoint, corpus_bin, tmp_path, capsys
):
    out = tmp_path / "dca.pt"
    assert retrofit_module.main([str(preln_checkpoint), str(out), "--dca-k", "2"]) == 0
    assert "--restore-file" in capsys.readouterr().out and [p.name for p in tmp_path.iterdir()] == ["dca.pt"]
    models, _ = checkpoint_utils.load_model_ensemble([str(out)])
    assert isinstance(models[0], ALIASES["dca_transformer"])
    assert models[0].encoder.carry.k == 2 and models[0].encoder.layers[3].grn.b.shape == (3, 4, 16)

    extra = [*SHAPE, "--dca-k", "2", "--restore-file", out, "--reset-optimizer"]
    commands = [
        generate_command(corpus_bin, preln_checkpoint),
        generate_command(corpus_bin, out),
        train_command(corpus_bin, tmp_path / "continue", "dca_e6d6", max_update=1, extra=extra),
    ]
    before, after, trained = map(run_forked, commands)  # three fairseq processes, forked: no start-up time
    assert sorted(hypotheses(after.stdout)) == list(range(21))
    assert hypotheses(after.stdout) == hypotheses(before.stdout)
    assert "Loaded checkpoint" in trained.stdout + trained.stderr
    assert [int(r["num_updates"]) for r in train_log(trained.stdout)] == [1]


def _edited_copy(checkpoint, path, **model_options):
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    for name, value in model_options.items():
        setattr(state["cfg"]["model"], name, value)
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    "options,cli,message",
    [
        ({"encoder_normalize_before": False, "decoder_normalize_before": False}, [], "Post-LN"),
        ({}, ["--dca-k", "9"], "--dca-k must be an integer in [0, 4], got 9"),
        ({"arch": "residual_e6d6", "_name": "residual_e6d6"}, [], "not fairseq's transformer"),
    ],
)
def test_refuses_what_it_cannot_convert(retrofit_module, preln_checkpoint, tmp_path, options, cli, message, capsys):
    source = _edited_copy(preln_checkpoint, tmp_path / "in.pt", **options)
    assert retrofit_module.main([str(source), str(tmp_path / "out.pt"), *cli]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()


def test_loads_with_weights_only(retrofit_module, tmp_path, capsys):
    """A checkpoint that pickles a class outside fairseq's checkpoint types is refused, not unpickled."""
    torch.save({"model": {}, "cfg": {"model": fractions.Fraction(1, 3)}}, tmp_path / "evil.pt")
    assert retrofit_module.main([str(tmp_path / "evil.pt"), str(tmp_path / "out.pt")]) == 2
    assert "weights-only loading refused it" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()


def test_output_is_written_atomically(retrofit_module, tmp_path, monkeypatch):
    module = retrofit_module
    target = tmp_path / "out.pt"
    target.write_bytes(b"previous")

    def failing_save(obj, f):
        Path(f).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(module.torch, "save", failing_save)
    with pytest.raises(OSError):
        module.save_atomically({"x": 1}, target)
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["out.pt"]
