"""Write the golden checkpoints, translations and initial-weight fingerprints of tests/test_golden_models.py.

Run once, at commit 8302f79 (before the axes refactor of issue 26), from the repository root:

    python -m tests.golden.make_golden            # everything (a few minutes on one core)
    python -m tests.golden.make_golden --fingerprints-only

What it writes under tests/golden/:
- ``checkpoints/data/dict.{src,tgt}.txt``: the joined dictionary of the tiny reversal corpus (tests/helpers.py);
- ``checkpoints/<arch>.pt``: one model per family, TINY width, 2+2 layers, a handful of updates, no optimizer
  state and no path of the machine it was trained on;
- ``translations.json``: per checkpoint, the beam-search output (token ids, score, positional scores) of a few
  source sentences (their token ids are stored too, so the test needs no corpus);
- ``fingerprints.json``: per named preset built at TINY width with seed 0 (tests/helpers.py's build_model), the
  sha256 of its parameter names and shapes and of its initial values, and for each family's E6D6 preset one
  short hash per tensor (to tell which tensor moved). ``changed_by_design`` lists the presets whose initial
  weights a later commit changes on purpose, and why.

The checkpoints are regenerated only by deliberate choice: they stand for checkpoints users trained with the
code of 8302f79, and the test holds today's code to them.
"""

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
CHECKPOINTS = GOLDEN / "checkpoints"

from tests.helpers import (
    binarize,
    build_model,
    family_train_args,
    make_reversal_corpus,
    run,
    train_command,
)

# one preset per family (the E6D6 preset; Crossformer-All has only its paper's E16D6), trained at 2+2 layers
GOLDEN_ARCHS = (
    "transformer_preln_e6d6", "transformer_postln_e6d6", "residual_e6d6", "crossformer_sg_e6d6",
    "crossformer_hg_e6d6", "crossformer_hg_ffn_e6d6", "crossformer_hg_value_e6d6", "crossformer_all_e16d6",
    "dca_e6d6", "dca_k2_e6d6", "deepnet_e6d6", "admin_e6d6", "tfixup_e6d6", "b2t_e6d6", "normformer_e6d6",
    "dlcl_e6d6", "denseformer_e6d6", "laurel_rw_e6d6", "laurel_lr_e6d6", "laurel_pa_e6d6", "hc_static_e6d6",
    "hc_dynamic_e6d6",
)  # fmt: skip
LAYERS = ["--encoder-layers", "2", "--decoder-layers", "2"]
UPDATES = 6
SENTENCES = 4  # of the corpus's test split
BEAM, MAX_LEN_B = 3, 12


def tensor_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def fingerprint(model) -> dict:
    names, values = hashlib.sha256(), hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        names.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        values.update(name.encode() + p.detach().cpu().contiguous().numpy().tobytes())
    return {"names_shapes": names.hexdigest()[:32], "values": values.hexdigest()[:32]}


def per_tensor(model) -> dict:
    return {
        name: [list(p.shape), tensor_digest(p)[:12]]
        for name, p in sorted(model.state_dict().items())
    }


def make_fingerprints() -> dict:
    from fairseq_plugins.models import PRESETS

    out = {"presets": {}, "tensors": {}}
    for arch in sorted(PRESETS):
        model = build_model(arch)
        out["presets"][arch] = fingerprint(model)
        if arch in GOLDEN_ARCHS:
            out["tensors"][arch] = per_tensor(model)
    return out


def scrub(checkpoint: Path) -> None:
    """Drop the optimizer state and every path of this machine from a fairseq checkpoint."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["last_optimizer_state"] = None
    cfg = state["cfg"]  # a plain dict of sections; "model" is the argparse Namespace
    cfg["common"]["user_dir"] = None
    cfg["task"]["data"] = "data"
    cfg["checkpoint"]["save_dir"] = "checkpoints"
    model = cfg["model"]
    for key, value in (
        ("data", "data"),
        ("user_dir", None),
        ("save_dir", "checkpoints"),
    ):
        if hasattr(model, key):
            setattr(model, key, value)
    torch.save(state, checkpoint)


def translate(arch: str, source: list[list[int]]) -> list[dict]:
    """Beam-search output of the golden checkpoint of ``arch`` (the test computes it the same way)."""
    from tests.test_golden_models import beam_search, load_golden

    model, task = load_golden(arch)
    return beam_search(model, task, source)


def make_checkpoints(work: Path) -> None:
    data = binarize(make_reversal_corpus(work / "raw"), work / "bin")
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    (CHECKPOINTS / "data").mkdir(exist_ok=True)
    for lang in ("src", "tgt"):
        shutil.copy(
            data / f"dict.{lang}.txt", CHECKPOINTS / "data" / f"dict.{lang}.txt"
        )
    for arch in GOLDEN_ARCHS:
        save = work / arch
        extra = [*LAYERS, "--no-save-optimizer-state", "--no-last-checkpoints", "--save-interval-updates",
                 str(UPDATES), "--keep-interval-updates", "1", "--disable-validation", *family_train_args(arch)]  # fmt: skip
        run(train_command(data, save, arch, max_update=UPDATES, extra=extra))
        (produced,) = [p for p in save.glob("checkpoint_*_*.pt")]
        scrub(produced)
        shutil.copy(produced, CHECKPOINTS / f"{arch}.pt")
        print(arch, (CHECKPOINTS / f"{arch}.pt").stat().st_size, "bytes", flush=True)


def make_translations(work: Path) -> dict:
    from fairseq.data import Dictionary

    d = Dictionary.load(str(CHECKPOINTS / "data" / "dict.src.txt"))
    lines = (
        (make_reversal_corpus(work / "raw") / "test.src")
        .read_text()
        .splitlines()[:SENTENCES]
    )
    source = [
        d.encode_line(line, add_if_not_exist=False, append_eos=True).long().tolist()
        for line in lines
    ]
    return {"source": source, "beam": BEAM, "max_len_b": MAX_LEN_B,
            "outputs": {arch: translate(arch, source) for arch in GOLDEN_ARCHS}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fingerprints-only", action="store_true")
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="only translate the committed checkpoints",
    )
    args = parser.parse_args()
    if not args.fingerprints_only:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.keep_checkpoints:
                make_checkpoints(Path(tmp))
            translations = make_translations(Path(tmp))
        (GOLDEN / "translations.json").write_text(
            json.dumps(translations, indent=0) + "\n"
        )
    fingerprints = {"changed_by_design": {}, **make_fingerprints()}
    (GOLDEN / "fingerprints.json").write_text(
        json.dumps(fingerprints, indent=0, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    main()
