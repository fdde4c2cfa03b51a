"""fairseq's loggers with the plugin's models: ``--tensorboard-logdir`` writes, for a plugin arch, the event files
and scalars it writes for fairseq's own transformer (tensorboardX, pinned in scripts/requirements.txt); no command
asks for tensorboardX; a plain fairseq-train of a plugin arch prints no warning (the plugin silences fairseq's
unactionable ones, fairseq_plugins/quiet_warnings.py)."""

import struct

import pytest

from .forkserver import run_forked
from .helpers import fairseq_cli, run, train_command


def scalars(logdir) -> dict[str, set[str]]:
    """{subset (train_inner, train, valid): the scalar tags of its event files} (TFRecord: length, crc, event, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    tags: dict[str, set[str]] = {}
    for path in logdir.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            tags.setdefault(path.parent.name, set()).update(v.tag for v in event.summary.value)
    return tags


@pytest.mark.parametrize("arch", ["residual_iwslt_e6d6"])
def test_tensorboard_logs_the_plugin_arch_as_fairseqs_own(tmp_path, corpus_bin, arch):
    logged = {}
    for name in (arch, "transformer_iwslt_de_en"):
        logdir = tmp_path / name / "tb"
        command = train_command(corpus_bin, tmp_path / name / "ckpt", name, max_update=2,
                                extra=["--tensorboard-logdir", logdir])  # fmt: skip
        if name == arch:
            # the plugin's run as a user types it, in a new interpreter without the recipes' environment: the
            # plugin's import silences fairseq's warnings no user can act on (fairseq_plugins/quiet_warnings.py);
            # fairseq asks for tensorboardX, if at all, when its tasks are imported, which only a new interpreter does
            proc = run(command, env={"PYTHONWARNINGS": ""})
            assert "Please install tensorboardX" not in proc.stdout + proc.stderr
            assert "Warning" not in proc.stderr, proc.stderr[-3000:]
        else:  # fairseq's own transformer: only its scalars are compared, forked (no interpreter start-up)
            run_forked(command)
        logged[name] = scalars(logdir)
    assert {"loss", "nll_loss", "ppl", "lr", "gnorm"} <= logged[arch]["train_inner"]
    assert "loss" in logged[arch]["valid"]
    assert logged[arch] == logged["transformer_iwslt_de_en"]


def test_preprocess_does_not_ask_for_tensorboardx(tmp_path):
    proc = run(fairseq_cli("preprocess") + ["--help"])
    assert "Please install tensorboardX" not in proc.stdout + proc.stderr
