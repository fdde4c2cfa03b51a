"""The package and its command (docs/cli.md): the wheel's dependencies, ``fairseq-residual user-dir/list/describe``
from a directory outside the checkout, and the one-line failures: an unknown --arch or axis choice, a plugin
checkpoint decoded without --user-dir, fairseq-hydra-train."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from fairseq_plugins import cli

from .forkserver import run_forked
from .helpers import REPO, TINY, run

SOURCES = ("setup.py", "MANIFEST.in", "fairseq_residual.py", "scripts/requirements.txt", "fairseq_plugins")
DEVELOPMENT_ONLY = ("pytest", "pytest-xdist", "execnet", "hypothesis", "ruff")
TRAIN = ["--cpu", "--seed", "1", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", "--max-update", "2",
         "--criterion", "label_smoothed_cross_entropy", "--no-progress-bar", "--no-epoch-checkpoints",
         "--num-workers", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from a copy of the sources, installed in a new venv that borrows the pinned stack from
    this one (a .pth line, so the checkout's editable install is not seen there); (wheel, venv bin directory)."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"
    for name in SOURCES:  # a copy: building in the checkout would leave build/ and egg-info there
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheel", source], cwd=root)
    run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], cwd=root)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(purelib, "stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = (root / "wheel").glob("*.whl")
    run([*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], cwd=root)
    return wheel, root / "venv" / "bin"


def in_venv(bin_dir: Path, command: str, cwd: Path, check=True):
    """``bash -c command`` with the venv first on PATH (as after activating it), in ``cwd``."""
    return run(["bash", "-c", command], cwd=cwd, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, check=check)


def test_the_wheel_declares_the_pinned_runtime_stack_and_python_3_11(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        entry_points = archive.read(next(n for n in archive.namelist() if n.endswith("entry_points.txt"))).decode()
    pins = [line.split("#")[0].strip() for line in (REPO / "scripts" / "requirements.txt").read_text().splitlines()]
    runtime = [pin for pin in pins if pin and pin.split("==")[0] not in DEVELOPMENT_ONLY]
    declared = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert declared == runtime and "torch==2.13.0" in declared and "ve-fairseq==0.12.3" in declared
    assert "Requires-Python: >=3.11,<3.12" in metadata
    assert "fairseq-residual = fairseq_residual:main" in entry_points
    assert "fairseq_residual = fairseq_residual:install" in entry_points  # torch.backends: the --user-dir hint


def test_installed_command_trains_describes_and_names_a_missing_user_dir(installed, corpus_bin, tmp_path):
    """From a directory outside the checkout: user-dir, fairseq-train with it, describe on the checkpoint, and
    fairseq-generate without --user-dir saying what to add."""
    _, bin_dir = installed
    where = in_venv(bin_dir, "fairseq-residual user-dir; python -m fairseq_plugins.cli user-dir", tmp_path).stdout
    assert where.split() == [str(bin_dir.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                                 / "site-packages" / "fairseq_plugins")] * 2  # fmt: skip
    train = ["python", "-m", "fairseq_cli.train", str(corpus_bin), "--user-dir", '"$(fairseq-residual user-dir)"',
             "--arch", "residual_e6d6", "--residual", "deepnet", *TINY, *TRAIN, "--save-dir", "checkpoints"]  # fmt: skip
    in_venv(bin_dir, " ".join(train), tmp_path)
    described = in_venv(bin_dir, "fairseq-residual describe checkpoints/checkpoint_last.pt", tmp_path).stdout
    for expected in ("--arch       residual_e6d6", "--residual deepnet --depth-aggregation none", "E6D6 16/32/2",
                     "(the model rebuilt from its options)", "--deepnet-init", "optimizer._name                adam",
                     "optimization.max_update        2", "trained      2 updates", "fairseq 0.12.3",
                     '--user-dir "$(fairseq-residual user-dir)"'):  # fmt: skip
        assert expected in described, described
    generate = ["python", "-m", "fairseq_cli.generate", str(corpus_bin), "--path", "checkpoints/checkpoint_last.pt",
                "--cpu", "--max-tokens", "500"]  # fmt: skip
    proc = in_venv(bin_dir, " ".join(generate), tmp_path, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "generate.py: error: checkpoint checkpoints/checkpoint_last.pt was trained with --user-dir "
        f"{where.split()[0]} (--arch residual_e6d6), which this command did not load: add --user-dir "
        '"$(fairseq-residual user-dir)"'
    )


def test_list_reads_the_declarations(capsys):
    cli.main(["list", "--axis", "residual"])
    out = capsys.readouterr().out
    assert "--residual CHOICE: how a sublayer's output joins the residual stream" in out
    assert "  resi-dual      ResiDual (arXiv:2304.14802)" in out and "--dual-residual-scale S" in out
    assert "--depth-aggregation" not in out and "--arch" not in out
    cli.main(["list", "--grep", "MHC"])
    out = capsys.readouterr().out
    assert "  mhc-lite       mHC-lite" in out and "--mhc-rate N" in out and "(8: mhc_e6d6 ... mhc_iwslt_e36d6)" in out
    assert "deepnet" not in out and "--residual CHOICE" not in out
    cli.main(["list", "--archs", "--grep", "dca_k2_e6d6"])
    out = capsys.readouterr().out.splitlines()
    # dca-k's own default k is 2: a choice's defaults are not repeated
    assert out[1].split() == ["dca_k2_e6d6", "dca_transformer", "E6D6", "512/2048/8", "--depth-aggregation", "dca-k"]


def test_describe_refuses_a_missing_file_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["describe", str(tmp_path / "none.pt")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == f"fairseq-residual describe: error: no checkpoint file at {tmp_path / 'none.pt'}"


def test_unknown_arch_and_axis_choice_suggest_the_nearest_names(corpus_bin, tmp_path, in_one_forked_process):
    """Both commands in one process (fairseq-train's own entry point, tests/one_process.py, forked from a server that
    never imports the plugin: conftest.py in_one_forked_process): the first loads the plugin through --user-dir as a
    fresh process does; both fail while parsing, before anything is trained."""
    train = [corpus_bin, "--user-dir", REPO / "fairseq_plugins", *TRAIN, "--save-dir", tmp_path]
    arch, choice = in_one_forked_process([("train", [*train, "--arch", "residal_e6d6"]),
                                          ("train", [*train, "--arch", "residual_e6d6", "--residual", "prex"])])  # fmt: skip
    error = arch.output.strip().splitlines()[-1]
    assert arch.returncode == 2 and error == (
        "train.py: error: argument --arch/-a: unknown architecture 'residal_e6d6'; did you mean residual_e6d6 or "
        "residual_e36d6 or residual_e24d6? (the plugin's names: fairseq-residual list)"
    )  # fairseq's own message listed all 1,852 names
    assert choice.returncode == 2 and choice.output.strip().splitlines()[-1].endswith("got 'prex'; did you mean pre?")


def test_hydra_train_refuses_a_plugin_arch_in_one_line(corpus_bin, tmp_path):
    hydra = [sys.executable, "-m", "fairseq_cli.hydra_train", "++task._name=translation", f"++task.data={corpus_bin}",
             "++model._name=residual_e6d6", f"common.user_dir={REPO / 'fairseq_plugins'}", "common.cpu=true",
             "optimization.max_update=2", "dataset.max_tokens=1000", "++criterion._name=cross_entropy",
             "++optimizer._name=adam", "++lr_scheduler._name=fixed", "optimization.lr=[0.001]",
             f"checkpoint.save_dir={tmp_path / 'checkpoints'}", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    proc = run_forked(hydra, cwd=tmp_path, check=False)  # its own process, forked from a pre-imported interpreter
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr
    assert (
        "the plugin's model residual_e6d6 cannot be built from a hydra config (fairseq-hydra-train): it reads its "
        "options from fairseq-train's command line, which fairseq's hydra path does not pass on; train with "
        'fairseq-train DATA --user-dir "$(fairseq-residual user-dir)" --arch residual_e6d6 ... (docs/cli.md)\n'
    ) in proc.stderr
