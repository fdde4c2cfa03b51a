#!/usr/bin/env python
"""The main job (recipes/main_job.sh): a small study of ResiDual's depth claim on Multi30k De->En, at CPU scale.

ResiDual's table 2 (Xie et al. 2023): at E12D12 the Post-LN transformer fails to train, Pre-LN and ResiDual
train. The main job trains the three at E12D12, width 128 (FFN 512, 4 heads), on the same data, seed, batch
(4,096 tokens) and schedule (peak lr 1e-3, 400 warm-up updates, dropout 0.1) for the same 180 updates, all at
once with one thread each, then translates test_2016_flickr (beam 5) and reports BLEU, chrF, the learning
curves, sacrebleu's paired bootstrap test against Pre-LN (the first architecture, the baseline) and a reading
of the numbers. It is scripts/study/study.py with these defaults: every option and variable of
recipes/study.sh works here too (more updates, seeds, architectures, LRS/WARMUPS, TRAIN_MINUTES).

Why 180 updates: timed on 2 idle cores (2026-11-23), the three models side by side make one update every 7.8 s
(validation included), so 180 updates take about 23 minutes, and with data preparation and translation the job
stays under 30 minutes. It is the early phase of training (the warm-up has not ended): the learning curves
carry the result, BLEU is low for every model. A longer run: ``MAX_UPDATE=1200`` (about 2.6 hours),
``SEEDS='1 2'``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "study"))

from study import Defaults
from study import main as study_main
from study_common import REPO, run_main

TAG = "main"
DEFAULTS = Defaults(
    archs="transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12",
    seeds="1",
    max_update=180,
    out_dir=REPO / "work_dirs" / "main_job",
    jobs="all",
    tag=TAG,
    description=__doc__,
)


def main(argv=None):
    study_main(argv, DEFAULTS)


if __name__ == "__main__":
    run_main(TAG, main)
