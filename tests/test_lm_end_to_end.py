"""fairseq's own command lines with ``--user-dir``: fairseq-train --task language_modeling, then fairseq-eval-lm
on the checkpoint it wrote (one family; the in-process tests cover every family)."""

import json
import math
import re
import sys

from .forkserver import run_forked
from .helpers import PLUGIN_DIR
from .lm_helpers import TASK_ARGS, TINY_LM, binarize_lm, make_lm_corpus

# both tools in one process, forked from a pre-imported interpreter (tests/forkserver.py): fairseq's start-up
# (importing fairseq and torch) is not paid at all
BOTH = (
    "import json, sys\n"
    "from fairseq_cli import eval_lm, train\n"
    "argvs = json.loads(sys.argv[1])\n"
    "sys.argv = ['fairseq-train', *argvs[0]]\n"
    "train.cli_main()\n"
    "sys.argv = ['fairseq-eval-lm', *argvs[1]]\n"
    "eval_lm.cli_main()\n"
)


def test_fairseq_train_and_eval_lm(tmp_path):
    data = binarize_lm(make_lm_corpus(tmp_path / "raw"), tmp_path / "bin")
    save = tmp_path / "save"
    train = [
        data, "--user-dir", PLUGIN_DIR, "--arch", "dca_lm_d6", *TASK_ARGS, *TINY_LM, "--cpu", "--seed", "1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.1", "--lr", "3e-3",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2", "--max-tokens", "400", "--max-update", "12",
        "--criterion", "cross_entropy", "--save-dir", save, "--no-progress-bar", "--log-interval", "1",
        "--log-format", "json", "--no-epoch-checkpoints", "--num-workers", "0",
    ]  # fmt: skip
    evaluate = [data, "--user-dir", PLUGIN_DIR, "--path", save / "checkpoint_last.pt", *TASK_ARGS, "--cpu",
                "--max-tokens", "400", "--num-workers", "0", "--gen-subset", "test"]  # fmt: skip
    argvs = [[str(a) for a in argv] for argv in (train, evaluate)]
    proc = run_forked([sys.executable, "-c", BOTH, json.dumps(argvs)], timeout=600)
    # both tools' logging goes through the first one's handler: "INFO:train_inner:{...}" lines
    steps = [json.loads(m) for m in re.findall(r"train_inner\W+(\{.*\})", proc.stdout + proc.stderr)]
    assert len(steps) == 12 and all(math.isfinite(float(s["loss"])) for s in steps)
    assert float(steps[-1]["loss"]) < float(steps[0]["loss"])
    found = re.search(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", proc.stdout + proc.stderr)
    assert found, (proc.stdout + proc.stderr)[-3000:]
    # 40 word types + specials: a model that learned nothing scores about 44; the corpus counts up, so it learns
    assert 1 < float(found.group(2)) < 44
