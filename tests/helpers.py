"""Shared test utilities: build tiny models through fairseq's own argument parser, compare incremental and
full-sequence decoding, make and binarize a tiny parallel corpus, and run fairseq's command-line tools."""

import os
import random
import subprocess
import sys
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_plugins  # noqa: F401  (registers the plugin)

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "fairseq_plugins"

# tiny widths for fast tests: the presets' depths are kept, only the widths shrink
TINY = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]  # fmt: skip


class TinyTask:
    """The two dictionaries a translation model is built from, without any data on disk."""

    def __init__(self, vocab_size: int = 20):
        self.source_dictionary = make_dictionary(vocab_size)
        self.target_dictionary = self.source_dictionary


def make_dictionary(vocab_size: int) -> Dictionary:
    d = Dictionary()
    for i in range(vocab_size):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def parse_model_args(arch: str, extra: Sequence[str] = (), tiny: bool = True) -> Namespace:
    """Parse ``--arch arch`` plus ``extra`` exactly as fairseq-train does (defaults, arch function)."""
    parser = options.get_training_parser()
    argv = ["unused-data-dir", "--arch", arch, "--task", "translation", "--cpu"]
    argv += (TINY if tiny else []) + list(extra)
    return options.parse_args_and_arch(parser, input_args=argv)


def build_model(arch: str, extra: Sequence[str] = (), seed: int = 0, task=None, tiny: bool = True):
    """Build ``arch`` at tiny width with a fixed seed, in eval mode (dropout off)."""
    args = parse_model_args(arch, extra, tiny)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task or TinyTask())
    return model.eval()


def random_batch(model, batch: int = 3, src_len: int = 7, tgt_len: int = 6, seed: int = 0, pad_src=True):
    """Random source/target tokens; sentence b of the source has b pads on the left (fairseq's default)."""
    g = torch.Generator().manual_seed(seed)
    d = model.encoder.dictionary
    low, high = d.nspecial, len(d)
    src = torch.full((batch, src_len), d.pad())
    lengths = torch.empty(batch, dtype=torch.long)
    for b in range(batch):
        n_pad = min(b, src_len - 2) if pad_src else 0
        src[b, n_pad:-1] = torch.randint(low, high, (src_len - n_pad - 1,), generator=g)
        src[b, -1] = d.eos()
        lengths[b] = src_len - n_pad
    prev = torch.randint(low, high, (batch, tgt_len), generator=g)
    prev[:, 0] = d.eos()
    return src, lengths, prev


def full_and_incremental_logits(model, src, lengths, prev):
    """Decoder logits for every target position, computed in one pass and step by step with a cache."""
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=encoder_out)
        incremental_state: dict = {}
        steps = []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=incremental_state)
            steps.append(out)
    return full, torch.cat(steps, dim=1)


def load_script(relative: str, name: str | None = None):
    """A script of the repository (e.g. scripts/benchmark/before_after.py), imported by its package name
    (scripts.benchmark.before_after), so the tests patch the very module the other scripts import; ``name`` is
    the script's short name, kept for the callers."""
    import importlib

    return importlib.import_module(relative.removesuffix(".py").replace("/", "."))


BF16_EPS = 2.0**-7  # spacing of bfloat16 numbers in [1, 2)


def close_in_bf16(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within a few bfloat16 roundings of the larger logits."""
    return (a - b).abs().max().item() <= 8 * BF16_EPS * max(1.0, b.abs().max().item())


def parameter_gradients(model, batch) -> dict:
    """Every parameter's gradient of the mean log-sum-exp of the logits: a loss every output reaches, so two
    ways of computing one model (activation checkpointing, tied weights) can be compared gradient by gradient."""
    logits, _ = model(*batch)
    logits.float().logsumexp(-1).mean().backward()
    return {n: p.grad for n, p in model.named_parameters()}


def make_reversal_corpus(directory: Path, sizes=(("train", 400), ("valid", 40), ("test", 21)), seed: int = 0):
    """A tiny synthetic translation task: the target is the reversed, upper-cased source.

    21 test sentences: not a multiple of fairseq's default batch-size multiple (8), so a test that
    forgets ``--required-batch-size-multiple 1`` loses sentences and fails.
    """
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(40)]
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        with open(directory / f"{split}.src", "w") as fs, open(directory / f"{split}.tgt", "w") as ft:
            for _ in range(n):
                words = [rng.choice(vocab) for _ in range(rng.randint(3, 9))]
                fs.write(" ".join(words) + "\n")
                ft.write(" ".join(w.upper() for w in reversed(words)) + "\n")
    return directory


def fairseq_cli(tool: str) -> list[str]:
    """The command that runs a fairseq console script with this interpreter (no PATH lookups)."""
    module = {"train": "fairseq_cli.train", "generate": "fairseq_cli.generate",
              "preprocess": "fairseq_cli.preprocess", "interactive": "fairseq_cli.interactive",
              "validate": "fairseq_cli.validate"}[tool]  # fmt: skip
    return [sys.executable, "-m", module]


def run(cmd: Sequence[str], cwd=None, env=None, timeout: int = 600, input_text: str | None = None, check=True):
    """Run a command, return its completed process; on failure show its output in the assertion."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    full_env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [str(c) for c in cmd], check=False, cwd=cwd or REPO, env=full_env, capture_output=True, text=True,
        timeout=timeout, input=input_text,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def binarize(raw: Path, dest: Path, runner=run):
    """fairseq-preprocess, joined dictionary; ``runner``: run, or forkserver.run_forked (no interpreter start-up)."""
    runner(fairseq_cli("preprocess") + [
        "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
        "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", dest,
        "--joined-dictionary", "--workers", "1",
    ])  # fmt: skip
    return dest


def train_command(data: Path, save_dir: Path, arch: str, max_update: int = 4, extra: Sequence[str] = ()):
    return fairseq_cli("train") + [
        data, "--user-dir", PLUGIN_DIR, "--arch", arch, *TINY, "--cpu", "--seed", "1",
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", "--max-update", str(max_update),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--save-dir", save_dir, "--no-progress-bar", "--log-interval", "1", "--log-format", "json",
        "--no-epoch-checkpoints", "--num-workers", "0", *extra,
    ]  # fmt: skip


def generate_command(data: Path, checkpoint: Path, extra: Sequence[str] = ()):
    return fairseq_cli("generate") + [
        data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, "--cpu", "--beam", "5",
        "--max-tokens", "500", "--required-batch-size-multiple", "1", "--num-workers", "0", *extra,
    ]  # fmt: skip


def train_then_generate(data: Path, root: Path, archs: Sequence[str], in_one_forked_process) -> dict:
    """arch -> (fairseq-train's run of 2 updates, fairseq-generate's run on its checkpoint): every training in one
    process, then every decoding in a second, which reads only the checkpoints (tests/one_process.py, forked from
    the fork server: conftest.py in_one_forked_process), instead of a process per command."""
    trains = [("train", train_command(data, root / arch, arch, max_update=2)[3:]) for arch in archs]
    # an untrained model rarely stops: capped at 5 + source length tokens, not fairseq's 200 (each sentence is
    # translated)
    limits = ["--max-len-a", "1", "--max-len-b", "5"]
    decodes = [("generate", generate_command(data, root / arch / "checkpoint_last.pt", limits)[3:]) for arch in archs]
    trained = in_one_forked_process(trains)
    return dict(zip(archs, zip(trained, in_one_forked_process(decodes), strict=True), strict=True))


def check_translates_every_sentence(trained, decoded, sentences: int = 21):
    """Both runs succeeded and fairseq-generate translated every test sentence once."""
    trained.check()
    output = decoded.check().output
    assert sorted(hypotheses(output)) == list(range(sentences))
    assert f"Translated {sentences} sentences" in output


def hypotheses(generate_stdout: str) -> dict:
    """{sentence id: hypothesis text} from fairseq-generate's H- lines."""
    hyps = {}
    for line in generate_stdout.splitlines():
        if line.startswith("H-"):
            key, _score, text = (line.split("\t") + ["", ""])[:3]
            hyps[int(key[2:])] = text
    return hyps


def train_log(train_stdout: str, kind: str = "train_inner") -> list[dict]:
    """The JSON records fairseq-train logs with ``--log-format json`` (``train_inner``, ``valid``, ``train``)."""
    import json

    records = []
    for line in train_stdout.splitlines():
        marker = f"| {kind} | "
        if marker in line:
            records.append(json.loads(line.split(marker, 1)[1]))
    return records


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# training options a family needs beyond train_command's defaults (e.g. its own criterion)
FAMILY_TRAIN_ARGS: dict[str, list[str]] = {
    "crossformer_sg": ["--criterion", "label_smoothed_cross_entropy_with_guidance"],
}


def family_train_args(arch: str) -> list[str]:
    from fairseq_plugins.models import PRESETS

    return list(FAMILY_TRAIN_ARGS.get(PRESETS[arch].family, [])) if arch in PRESETS else []


# where a test trains real models per family (resume, DDP), CI trains the families whose training state differs in
# kind: a second stream (residual), a regularizing criterion (crossformer_sg), tied weights (crossformer_hg), GRNs
# with hand-written backward (dca_k2), profiled buffers (admin), a preallocated depth stack (denseformer), widened
# streams (hc_dynamic); the other families change only a layer's arithmetic. ALL_FAMILIES=1 trains every family.
CI_TRAINED_FAMILIES = ("residual", "crossformer_sg", "crossformer_hg", "dca_k2", "admin", "denseformer", "hc_dynamic")


def trained_families() -> list[str]:
    """The plugin's families with an E6D6 preset (fairseq's own transformer, the baselines' model, excluded),
    or CI's subset of them unless ALL_FAMILIES=1."""
    from fairseq_plugins.models import PRESETS
    from fairseq_plugins.models.baselines import BASELINE_MODEL

    families = sorted({p.family for p in PRESETS.values() if f"{p.family}_e6d6" in PRESETS and p.model != BASELINE_MODEL})
    if os.environ.get("ALL_FAMILIES") == "1":
        return families
    missing = set(CI_TRAINED_FAMILIES) - set(families)
    assert not missing, f"CI_TRAINED_FAMILIES names unknown families: {sorted(missing)}"
    return sorted(CI_TRAINED_FAMILIES)
