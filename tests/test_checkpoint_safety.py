"""Checkpoints load with torch's weights-only unpickler kept on: fairseq's own types are allowed, anything
else a checkpoint might smuggle in (a pickled callable) is still refused."""

import os
import pickle
import signal
import sys
import zipfile

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_plugins.checkpoint_safety import (
    FAIRSEQ_CHECKPOINT_GLOBALS,
    CheckpointCorruptError,
    CheckpointRefusedError,
)
from fairseq_plugins.checkpoint_saving import intact

from .forkserver import run_forked
from .helpers import PLUGIN_DIR, fairseq_cli, generate_command, train_command


class Smuggler:
    """Unpickling this calls os.system: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def checkpoint(corpus_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    run_forked(train_command(corpus_bin, save_dir, "residual_e6d6", max_update=2))
    return save_dir / "checkpoint_last.pt"


def test_fairseq_checkpoint_needs_the_allow_list(checkpoint):
    """Without the plugin, torch >= 2.6 refuses fairseq's checkpoint (so the allow-list is what loads it). Forked:
    the fork server imported torch and fairseq, never the plugin."""
    code = f"import torch; torch.load('{checkpoint}')"
    proc = run_forked([sys.executable, "-c", code], check=False)
    assert proc.returncode != 0 and "argparse.Namespace" in proc.stderr


def test_fairseq_checkpoint_loads_weights_only(checkpoint):
    state = torch.load(checkpoint, weights_only=True)
    assert state["cfg"]["model"].arch == "residual_e6d6"  # an argparse.Namespace
    assert torch.serialization.get_unsafe_globals_in_checkpoint(checkpoint) == []


def test_allow_list_holds_no_callable_that_runs_code():
    dangerous = {os.system, eval, exec, getattr, __import__, pickle.loads, torch.load}
    assert not dangerous & set(FAIRSEQ_CHECKPOINT_GLOBALS)


def smuggling_checkpoint(checkpoint, tmp_path):
    marker = tmp_path / "code-was-executed"
    state = torch.load(checkpoint, weights_only=True)
    state["extra_state"]["payload"] = Smuggler(marker)
    bad = tmp_path / "checkpoint_bad.pt"
    torch.save(state, bad)
    return bad, marker


def test_smuggled_callable_is_refused_by_fairseqs_loader(checkpoint, tmp_path):
    bad, marker = smuggling_checkpoint(checkpoint, tmp_path)
    with pytest.raises(CheckpointRefusedError, match=f"refusing to load checkpoint {bad}: .*posix.system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(bad))
    assert not marker.exists()


def test_smuggled_callable_is_refused_by_fairseq_generate(checkpoint, corpus_bin, tmp_path):
    bad, marker = smuggling_checkpoint(checkpoint, tmp_path)
    proc = run_forked(generate_command(corpus_bin, bad), check=False)
    assert proc.returncode != 0 and f"refusing to load checkpoint {bad}" in proc.stderr
    assert not marker.exists()


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_checkpoint_is_named_in_a_clear_error(checkpoint, tmp_path):
    damaged = tmp_path / "checkpoint_last.pt"
    damaged.write_bytes(checkpoint.read_bytes())
    truncate(damaged)
    with pytest.raises(CheckpointCorruptError, match=f"checkpoint {damaged} is truncated or corrupt"):
        checkpoint_utils.load_checkpoint_to_cpu(str(damaged))


def damaged_pickle(checkpoint, tmp_path, how):
    """A copy of checkpoint whose pickle (data.pkl in the zip) is cut short or starts with a byte no pickle has."""
    damaged = tmp_path / f"checkpoint_{how}.pt"
    with zipfile.ZipFile(checkpoint) as src, zipfile.ZipFile(damaged, "w", zipfile.ZIP_STORED) as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("data.pkl"):
                data = data[: len(data) // 2] if how == "cut" else b"\xd8" + data[1:]
            dst.writestr(name, data)
    return damaged


@pytest.mark.parametrize("how", ["truncated", "cut", "flipped", "garbage", "empty"])
def test_a_damaged_checkpoint_is_told_apart_from_a_refused_global(checkpoint, tmp_path, how):
    if how in ("cut", "flipped"):
        damaged = damaged_pickle(checkpoint, tmp_path, how)
    else:
        damaged = tmp_path / "checkpoint_last.pt"
        data = {"truncated": checkpoint.read_bytes()[:-1000], "garbage": bytes(range(256)) * 8, "empty": b""}[how]
        damaged.write_bytes(data)
    with pytest.raises(CheckpointCorruptError, match=f"checkpoint {damaged} is truncated or corrupt") as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(damaged))
    assert "unsupported global" not in str(err.value) and "arbitrary code" not in str(err.value)


def test_resuming_from_a_truncated_checkpoint_stops_instead_of_starting_afresh(checkpoint, corpus_bin, tmp_path):
    damaged = tmp_path / "checkpoint_last.pt"
    damaged.write_bytes(checkpoint.read_bytes())
    truncate(damaged)
    proc = run_forked(train_command(corpus_bin, tmp_path, "residual_e6d6", max_update=4), check=False)
    assert proc.returncode != 0
    assert f"checkpoint {damaged} is truncated or corrupt" in proc.stderr
    assert "num_updates" not in proc.stdout  # no training step ran


def test_smuggled_callable_is_refused_by_interactive_and_from_pretrained(checkpoint, corpus_bin, tmp_path):
    bad, marker = smuggling_checkpoint(checkpoint, tmp_path)
    interactive = run_forked(fairseq_cli("interactive") + [
        corpus_bin, "--user-dir", PLUGIN_DIR, "--path", bad, "--cpu", "--source-lang", "src", "--target-lang", "tgt",
    ], input_text="w1 w2\n", check=False)  # fmt: skip
    assert interactive.returncode != 0 and f"refusing to load checkpoint {bad}" in interactive.stderr
    code = (
        "import fairseq_plugins\n"
        "from fairseq.models.transformer import TransformerModel\n"
        f"TransformerModel.from_pretrained('{tmp_path}', '{bad.name}', '{corpus_bin}')\n"
    )
    hub = run_forked([sys.executable, "-c", code], check=False)
    assert hub.returncode != 0 and "refusing to load checkpoint" in hub.stderr
    assert not marker.exists()


COPY_KILLED = """
import resource, signal, sys
import fairseq_plugins
from fairseq import checkpoint_utils
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the default kills the process, as SIGKILL would
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))  # the copy stops halfway
checkpoint_utils.PathManager.copy(sys.argv[1], sys.argv[2], overwrite=True)  # what save_checkpoint calls
"""


def test_a_copy_to_the_last_checkpoint_killed_midway_leaves_the_old_one_whole(tmp_path):
    """fairseq-train copies each save to checkpoint_last.pt; a process killed inside that copy (here by the file
    size limit, halfway) must leave the previous checkpoint_last.pt as it was, not truncated. Forked: the limit and
    the signal's default are set in the command's own process, as in a new interpreter."""
    new, last = tmp_path / "checkpoint_1_6.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(os.urandom(1 << 20))
    old = os.urandom(1000)
    last.write_bytes(old)
    proc = run_forked([sys.executable, "-c", COPY_KILLED, new, last, 1 << 19], check=False)
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr[-2000:]  # killed inside the copy
    assert last.read_bytes() == old
    assert checkpoint_utils.PathManager.copy(str(new), str(last), overwrite=True)  # and a whole copy replaces it
    assert last.read_bytes() == new.read_bytes() and not (tmp_path / "checkpoint_last.pt.tmp").exists()


def test_the_error_for_a_damaged_checkpoint_names_the_intact_one_to_copy_over_it(checkpoint, tmp_path):
    intact = tmp_path / "checkpoint_1_2.pt"
    intact.write_bytes(checkpoint.read_bytes())
    damaged = tmp_path / "checkpoint_last.pt"
    damaged.write_bytes(b"")
    with pytest.raises(CheckpointCorruptError, match=f"copy it over {damaged} \\(cp {intact} {damaged}\\)"):
        checkpoint_utils.load_checkpoint_to_cpu(str(damaged))
    intact.unlink()
    with pytest.raises(CheckpointCorruptError, match="no other intact checkpoint is in .*would start training again"):
        checkpoint_utils.load_checkpoint_to_cpu(str(damaged))


def test_only_a_whole_checkpoint_counts_as_intact(checkpoint, tmp_path):
    cut = tmp_path / "checkpoint_cut.pt"
    data = checkpoint.read_bytes()
    assert intact(str(checkpoint))
    for damaged in (data[: len(data) // 2], data[:-1], b"", bytes(range(256)) * 8):
        cut.write_bytes(damaged)
        assert not intact(str(cut)), len(damaged)
