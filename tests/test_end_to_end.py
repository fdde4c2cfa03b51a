"""fairseq's own command-line tools with ``--user-dir fairseq_plugins``: preprocess, train, generate,
interactive, resume (also distributed, 2 CPU processes on gloo) and real half-precision training on CPU.
No environment variable is set: checkpoints load with torch's default weights-only loading.

The trainings run in one process and the decodings and the resumed run in a second (tests/one_process.py, forked
from a pre-imported interpreter: conftest.py in_one_forked_process), each through the tool's own entry point; the
distributed ranks and fairseq-interactive reading stdin run as processes of their own (fairseq-interactive forked
from the same interpreter, tests/forkserver.py)."""

import math
import shutil
import subprocess

import pytest
from fairseq.models.transformer import TransformerModel

from .forkserver import forked_python_modules, run_forked
from .helpers import (
    PLUGIN_DIR,
    REPO,
    check_translates_every_sentence,
    fairseq_cli,
    free_port,
    generate_command,
    hypotheses,
    train_command,
    train_log,
)

RESIDUAL = "residual_e18d18"  # the acceptance example, at tiny width
ARCHS = [RESIDUAL, "transformer_preln_e6d6", "transformer_postln_e6d6"]
N_TEST = 21  # sentences in the tiny corpus' test split
# models trained for a few updates never end a sentence: decoding stops at the length limit, fairseq's default 200
# tokens; this limit leaves room for the longest test sentence's whole translation (9 words) and its end
MAX_LEN = ["--max-len-a", "0", "--max-len-b", "10"]
DEEP = "residual_iwslt_e36d6"
PRECISIONS = {"mem-eff": ["--memory-efficient-fp16"], "fp16": ["--fp16", "--fp16-no-flatten-grads"]}


@pytest.fixture(scope="module")
def trained(corpus_bin, tmp_path_factory, in_one_forked_process):
    """Each architecture trained for 4 updates, and the deep residual model for 3 in each half precision, in one
    process; name (arch or precision id) -> (save dir, the training's Run)."""
    root = tmp_path_factory.mktemp("trained")
    saves = {name: root / name for name in [*ARCHS, *PRECISIONS]}
    commands = [("train", train_command(corpus_bin, saves[arch], arch, max_update=4)[3:]) for arch in ARCHS]
    commands += [("train", train_command(corpus_bin, saves[name], DEEP, max_update=3,
                                         extra=[*precision, "--dual-residual-scale", "0.05"])[3:])
                 for name, precision in PRECISIONS.items()]  # fmt: skip
    return {name: (saves[name], r) for name, r in zip(saves, in_one_forked_process(commands), strict=True)}


@pytest.fixture(scope="module")
def decoded(trained, corpus_bin, tmp_path_factory, in_one_forked_process):
    """In a second process: fairseq-generate on every checkpoint of ``trained`` (name -> Run), and the residual
    model's training resumed from a copy of its save dir for 2 more updates ("resume" -> (save dir, Run))."""
    names = [name for name, (_, training) in trained.items() if training.returncode == 0]
    resume = tmp_path_factory.mktemp("resume") / "save"
    shutil.copytree(trained[RESIDUAL][0], resume)
    commands = [("generate", generate_command(corpus_bin, trained[name][0] / "checkpoint_last.pt", MAX_LEN)[3:])
                for name in names]  # fmt: skip
    commands.append(("train", train_command(corpus_bin, resume, RESIDUAL, max_update=6)[3:]))
    *generated, resumed = in_one_forked_process(commands)
    return {**dict(zip(names, generated, strict=True)), "resume": (resume, resumed)}


@pytest.mark.parametrize("arch", ARCHS)
def test_train_then_generate_translates_every_sentence(arch, trained, decoded):
    check_translates_every_sentence(trained[arch][1], decoded[arch], N_TEST)


def test_resume_continues_from_checkpoint_last(trained, decoded):
    """A run started in another process than the one that wrote the checkpoint continues from it."""
    trained[RESIDUAL][1].check()
    output = decoded["resume"][1].check().output
    assert "Loaded checkpoint" in output
    updates = [int(r["num_updates"]) for r in train_log(output)]
    assert updates == [5, 6]


def test_distributed_resume_on_two_cpu_processes(trained, corpus_bin, tmp_path):
    """Rank 0 loads checkpoint_last.pt and broadcasts it (as an omegaconf DictConfig) to rank 1: the path
    that needs omegaconf's types allowed under weights-only loading."""
    save_dir = tmp_path / "ddp"
    shutil.copytree(trained[RESIDUAL][0], save_dir)
    port = free_port()
    base = train_command(corpus_bin, save_dir, RESIDUAL, max_update=6)
    dist = ["--distributed-world-size", "2", "--distributed-backend", "gloo", "--distributed-no-spawn",
            "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--ddp-backend", "legacy_ddp"]  # fmt: skip
    # each rank a process of its own, both forked from one pre-imported interpreter (forkserver.py's shim): one
    # start-up for the two instead of two
    with forked_python_modules():
        procs = [
            subprocess.Popen(
                [str(c) for c in base + dist + ["--distributed-rank", str(rank)]], cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
            )
            for rank in (0, 1)
        ]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out[-4000:]}"
    assert "Loaded checkpoint" in outputs[0]
    assert [int(r["num_updates"]) for r in train_log(outputs[0])] == [5, 6]


def test_interactive_translates_stdin(trained, corpus_bin):
    """Its own process reading stdin, forked from the pre-imported interpreter (tests/forkserver.py)."""
    proc = run_forked(fairseq_cli("interactive") + [
        corpus_bin, "--user-dir", PLUGIN_DIR, "--path", trained[RESIDUAL][0] / "checkpoint_last.pt",
        "--cpu", "--beam", "2", *MAX_LEN, "--source-lang", "src", "--target-lang", "tgt",
    ], input_text="w1 w2 w3\nw4 w5\n")  # fmt: skip
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2


def test_from_pretrained_loads_and_translates(trained, corpus_bin):
    """fairseq's own TransformerModel.from_pretrained, after ``import fairseq_plugins`` (tests/helpers.py imports
    it, as a user's script would), loads the plugin's model class from the checkpoint and translates."""
    hub = TransformerModel.from_pretrained(str(trained[RESIDUAL][0]), "checkpoint_last.pt", str(corpus_bin),
                                           source_lang="src", target_lang="tgt")  # fmt: skip
    assert type(hub.models[0]).__name__ == "ResiDualTransformerModel"
    assert isinstance(hub.translate("w1 w2 w3", max_len_a=0, max_len_b=10), str)


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_half_precision_training_of_a_deep_residual_model(precision, trained, decoded):
    records = train_log(trained[precision][1].check().output)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3]
    assert all(math.isfinite(float(r["loss"])) and "loss_scale" in r for r in records)
    assert len(hypotheses(decoded[precision].check().output)) == N_TEST
