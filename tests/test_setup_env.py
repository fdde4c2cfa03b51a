"""scripts/setup_env.sh's shared stack: a checkout's .venv is a hard-linked copy of the base venv that holds the
pinned stack (built once per machine), with its scripts pointed at the copy and the plugin installed editable from
the checkout; the base is left as it was. The base here is a stand-in: a venv without the stack whose site-packages
reads this interpreter's (for pip and setuptools), so the test costs one editable install, not a 1.5 GB stack."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_base(base: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", base], check=True)
    site = base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    script = base / "bin" / "fairseq-train"  # a console script as pip writes it: its venv's python in the shebang
    script.write_text(f"#!{base}/bin/python\nimport sys\nprint(sys.prefix)\n", encoding="utf-8")
    script.chmod(0o755)
    (base / ".complete").touch()
    return script


def setup(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", REPO / "scripts" / "setup_env.sh"], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip


def test_a_checkout_venv_is_the_base_linked_with_its_scripts_pointed_at_itself(tmp_path):
    base, venv = tmp_path / "stack", tmp_path / "checkout" / ".venv"
    script = make_base(base)
    before = script.read_bytes()
    env = {**os.environ, "STACK_VENV": str(base), "VENV_DIR": str(venv), "PYTHON": sys.executable}
    out = setup(env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "installing the pinned stack" not in out.stdout + out.stderr  # the finished base is reused, not rebuilt
    copy = venv / "bin" / "fairseq-train"
    assert copy.read_text(encoding="utf-8").splitlines()[0] == f"#!{venv}/bin/python"
    assert script.read_bytes() == before and not (venv / ".complete").exists()
    assert subprocess.run([copy], capture_output=True, text=True, check=True).stdout.strip() == str(venv)
    where = subprocess.run([venv / "bin" / "python", "-c", "import fairseq_plugins; print(fairseq_plugins.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path)  # fmt: skip
    assert Path(where.stdout.strip()).parent == REPO / "fairseq_plugins"
    assert (venv / ".requirements.sha256").exists()
    # a second call finds the stamp and reuses the checkout's venv as is
    again = setup(env)
    assert again.returncode == 0 and "[setup] reusing" in again.stdout


def test_a_failed_install_of_the_stack_stops_the_set_up(tmp_path):
    """A base venv whose install fails is neither marked finished nor copied: the set-up exits with the failure."""
    python = tmp_path / "python3.11"  # a Python whose venv module fails
    python.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m venv" ] && exit 3\nexec {sys.executable} "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    base, venv = tmp_path / "stack", tmp_path / "checkout" / ".venv"
    out = setup({**os.environ, "STACK_VENV": str(base), "VENV_DIR": str(venv), "PYTHON": str(python)})
    assert out.returncode != 0 and "installing the pinned stack once" in out.stdout
    assert not (base / ".complete").exists() and not venv.exists()
