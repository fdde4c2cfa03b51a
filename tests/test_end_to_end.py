"""fairseq's own command-line tools with ``--user-dir fairseq_plugins``: preprocess, train, generate,
interactive, resume (also distributed, 2 CPU processes on gloo) and real half-precision training on CPU.
No environment variable is set: checkpoints load with torch's default weights-only loading."""

import math
import shutil
import subprocess
import sys

import pytest

from .helpers import (
    PLUGIN_DIR,
    REPO,
    fairseq_cli,
    free_port,
    generate_command,
    hypotheses,
    run,
    train_command,
    train_log,
)

RESIDUAL = "residual_e18d18"  # the acceptance example, at tiny width
ARCHS = [RESIDUAL, "transformer_preln_e6d6", "transformer_postln_e6d6"]
N_TEST = 21  # sentences in the tiny corpus' test split


@pytest.fixture(scope="module")
def trained(corpus_bin, tmp_path_factory):
    """Each architecture trained for 4 updates; arch -> save dir."""
    out = {}
    for arch in ARCHS:
        save_dir = tmp_path_factory.mktemp(arch)
        run(train_command(corpus_bin, save_dir, arch, max_update=4))
        out[arch] = save_dir
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_train_then_generate_translates_every_sentence(arch, trained, corpus_bin):
    proc = run(generate_command(corpus_bin, trained[arch] / "checkpoint_last.pt"))
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))
    assert f"Translated {N_TEST} sentences" in proc.stdout + proc.stderr


def test_resume_continues_from_checkpoint_last(trained, corpus_bin, tmp_path):
    save_dir = tmp_path / "resume"
    shutil.copytree(trained[RESIDUAL], save_dir)
    proc = run(train_command(corpus_bin, save_dir, RESIDUAL, max_update=6))
    assert "Loaded checkpoint" in proc.stdout + proc.stderr
    updates = [int(r["num_updates"]) for r in train_log(proc.stdout)]
    assert updates == [5, 6]


def test_distributed_resume_on_two_cpu_processes(trained, corpus_bin, tmp_path):
    """Rank 0 loads checkpoint_last.pt and broadcasts it (as an omegaconf DictConfig) to rank 1: the path
    that needs omegaconf's types allowed under weights-only loading."""
    save_dir = tmp_path / "ddp"
    shutil.copytree(trained[RESIDUAL], save_dir)
    port = free_port()
    base = train_command(corpus_bin, save_dir, RESIDUAL, max_update=6)
    dist = ["--distributed-world-size", "2", "--distributed-backend", "gloo", "--distributed-no-spawn",
            "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--ddp-backend", "legacy_ddp"]  # fmt: skip
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
    proc = run(fairseq_cli("interactive") + [
        corpus_bin, "--user-dir", PLUGIN_DIR, "--path", trained[RESIDUAL] / "checkpoint_last.pt",
        "--cpu", "--beam", "2", "--source-lang", "src", "--target-lang", "tgt",
    ], input_text="w1 w2 w3\nw4 w5\n")  # fmt: skip
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2


def test_from_pretrained_loads_and_translates(trained, corpus_bin):
    code = (
        "import fairseq_plugins\n"
        "from fairseq.models.transformer import TransformerModel\n"
        f"hub = TransformerModel.from_pretrained('{trained[RESIDUAL]}', 'checkpoint_last.pt', "
        f"'{corpus_bin}', source_lang='src', target_lang='tgt')\n"
        "print('TRANSLATION', type(hub.models[0]).__name__, hub.translate('w1 w2 w3'))\n"
    )
    proc = run([sys.executable, "-c", code])
    assert "TRANSLATION ResiDualTransformerModel" in proc.stdout


@pytest.mark.parametrize(
    "precision", [["--memory-efficient-fp16"], ["--fp16", "--fp16-no-flatten-grads"]], ids=["mem-eff", "fp16"]
)
def test_half_precision_training_of_a_deep_residual_model(precision, corpus_bin, tmp_path):
    extra = [*precision, "--dual-residual-scale", "0.05"]
    proc = run(train_command(corpus_bin, tmp_path, "residual_iwslt_e36d6", max_update=3, extra=extra))
    records = train_log(proc.stdout)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3]
    assert all(math.isfinite(float(r["loss"])) and "loss_scale" in r for r in records)
    generated = run(generate_command(corpus_bin, tmp_path / "checkpoint_last.pt"))
    assert len(hypotheses(generated.stdout)) == N_TEST
