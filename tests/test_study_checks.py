"""The study tool's variables (scripts/study/study.py, study_checks.py): a bad value or two that conflict stop it
before anything is prepared, naming the variable(s) and what would work; ARCH_LRS's forms; a variable that nearly
spells one of the tool's is named."""


import pytest

from scripts.study import (
    study,
    study_checks,
    study_common,
    study_pairing,
    study_stats,
)

from . import recipe_fixtures as fx


@pytest.mark.parametrize("argv, message", [
    (["--archs", ""], "ARCHS (--archs) is empty"),
    (["--archs", "residual_e6d6 residual_e6d6"], "ARCHS (--archs)='residual_e6d6 residual_e6d6': an architecture appears twice"),
    (["--seeds", "one"], "SEEDS (--seeds)='one': expected integers"),
    (["--variants", "cold"], "VARIANTS (--variants)='cold': allowed warmup, nowarmup"),
    (["--max-update", "0"], "MAX_UPDATE (--max-update)=0: must be > 0"),
    (["--train-minutes", "5", "--variants", "nowarmup"], "VARIANTS=nowarmup"),
    (["--lrs", "2"], "LRS (--lrs)='2'"),
    (["--warmups", "0"], "WARMUPS (--warmups)='0'"),
    (["--jobs", "-1"], "JOBS (--jobs)=-1"),
    (["--raw-dir", "/nowhere/multi30k"], "MULTI30K_DIR (--raw-dir)=/nowhere/multi30k: no such directory"),
])  # fmt: skip
def test_bad_settings_name_the_variable(argv, message):
    with pytest.raises(study_common.RecipeError, match=None) as err:
        study.parse_args(argv)
    assert message in str(err.value)


@pytest.mark.parametrize("argv, message", [
    (["--max-update", "100", "--valid-every", "200"], "VALID_EVERY=200 is larger than MAX_UPDATE=100"),
    (["--max-update", "800", "--valid-every", "100", "--patience", "8"], "PATIENCE=8 with MAX_UPDATE=800 and VALID_EVERY=100: only 8"),
    (["--train-minutes", "5", "--jobs", "64", "--threads", "2"], "TRAIN_MINUTES=5 with JOBS=64 x THREADS=2"),
    (["--seeds", "1", "--lrs", "1e-3 2e-3"], "LRS/WARMUPS offer 2 settings with SEEDS='1'"),
    (["--variants", "nowarmup", "--warmups", "100"], "WARMUPS='100' with VARIANTS='nowarmup'"),
    (["--max-update", "300", "--warmups", "400"], "WARMUPS=400 with MAX_UPDATE=300"),
    (["--data-bin", "/", "--vocab-size", "4000"], "DATA_BIN and VOCAB_SIZE are both set"),
    (["--level-margin", "0"], "LEVEL_MARGIN (--level-margin)=0"),
    (["--variants", "nowarmup", "--arch-lrs", "residual_iwslt_e12d12=1e-3@100"], "ARCH_LRS='residual_iwslt_e12d12=1e-3@100' gives warm-ups with VARIANTS='nowarmup'"),
    (["--max-update", "300", "--arch-lrs", "residual_iwslt_e12d12=1e-3@300"], "ARCH_LRS gives residual_iwslt_e12d12 warm-up 300 with MAX_UPDATE=300"),
    (["--seeds", "1", "--lrs", "1e-3 2e-3", "--arch-lrs", "residual_iwslt_e12d12=1e-3"], "LRS/WARMUPS offer 2 settings with SEEDS='1'"),
])  # fmt: skip
def test_conflicting_settings_name_both_variables(argv, message):
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(argv)
    assert message in str(err.value)


def test_vocabulary_too_large_for_the_training_lines_names_both_and_the_limit(tmp_path):
    import sentencepiece as spm

    fx.make_multi30k(tmp_path / "raw")
    args = study.parse_args(["--raw-dir", str(tmp_path / "raw"), "--train-lines", "20", "--out-dir", str(tmp_path / "out")])
    with pytest.raises(study_common.RecipeError) as err:
        study_checks.check_vocabulary(args)
    limit = int(str(err.value).split("allow at most ")[1].split()[0])
    assert "TRAIN_LINES and VOCAB_SIZE conflict: VOCAB_SIZE=8000" in str(err.value) and f"set VOCAB_SIZE <= {limit}" in str(err.value)
    files = [tmp_path / "raw" / f"train.{lang}.gz" for lang in ("de", "en")]
    text = [line for f in files for line in study_common.read_lines(f)[:20]]
    (tmp_path / "lines").write_text("\n".join(text) + "\n")
    for size, works in ((limit, True), (limit + 1, False)):  # the limit is SentencePiece's own, exactly
        try:
            spm.SentencePieceTrainer.train(input=str(tmp_path / "lines"), model_prefix=str(tmp_path / "m"), vocab_size=size,
                                           character_coverage=1.0, model_type="unigram", minloglevel=2, bos_id=-1,
                                           eos_id=-1, unk_id=0, pad_id=-1)  # fmt: skip
            assert works
        except RuntimeError:
            assert not works
    study_checks.check_vocabulary(study.parse_args(["--raw-dir", str(tmp_path / "raw"), "--train-lines", "20",
                                                    "--vocab-size", str(limit), "--out-dir", str(tmp_path / "out")]))  # fmt: skip



@pytest.mark.parametrize("value, message", [
    ("residual_iwslt_e12d12", "'residual_iwslt_e12d12' is not ARCH=LR[,LR...][@WARMUP[,WARMUP...]]"),
    ("residual_iwslt_e12d12=1e-3,1e-3", "gives a value twice"),
    ("residual_iwslt_e12d12=1e-3,", "is not ARCH=LR"),
    ("residual_iwslt_e12d12=1e-3,2", "has lr 2, not in (0, 1)"),
    ("residual_iwslt_e12d12=fast", "is not ARCH=LR"),
    ("residual_iwslt_e12d12=1e-3@x", "is not ARCH=LR"),
    ("=1e-3", "is not ARCH=LR"),
    ("dca_iwslt_e12d12=1e-3", "names dca_iwslt_e12d12, not in ARCHS"),
    ("residual_iwslt_e12d12=1e-3 residual_iwslt_e12d12=2e-3", "gives residual_iwslt_e12d12 a second time"),
    ("residual_iwslt_e12d12=2", "has lr 2, not in (0, 1)"),
    ("residual_iwslt_e12d12=1e-3@0", "has warm-up 0, not >= 1"),
])  # fmt: skip
def test_bad_arch_lrs_name_the_variable_and_the_allowed_form(value, message):
    with pytest.raises(study_common.RecipeError) as err:
        study.parse_args(["--arch-lrs", value])
    assert str(err.value).startswith("ARCH_LRS (--arch-lrs): ") and message in str(err.value)
    assert "allowed: space-separated ARCH=LR[,LR...][@WARMUP[,WARMUP...]] entries" in str(err.value)


def test_arch_lrs_give_their_models_one_setting_and_the_others_the_grid():
    """A study at each model's own lr (chosen before): no grid for those models, and the later seeds at it."""
    archs = "transformer_preln_iwslt_e12d12 transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"
    args = study.parse_args(["--archs", archs, "--seeds", "1 2", "--lrs", "5e-4 1e-3", "--max-update", "1000",
                             "--arch-lrs", "transformer_preln_iwslt_e12d12=4e-3 residual_iwslt_e12d12=2e-3@200"])  # fmt: skip
    tuning, later = study.grid(args)
    assert [(r.arch, r.lr, r.warmup) for r in tuning] == [
        ("transformer_preln_iwslt_e12d12", 4e-3, 400), ("transformer_postln_iwslt_e12d12", 5e-4, 400),
        ("transformer_postln_iwslt_e12d12", 1e-3, 400), ("residual_iwslt_e12d12", 2e-3, 200)]  # fmt: skip
    assert tuning[0].name == "transformer_preln_iwslt_e12d12.warmup.lr0.004.wu400.s1"
    choices = study_stats.choose_settings({r: {"valid_loss": 5.0} for r in tuning}, first_seed=1)
    assert (choices[("residual_iwslt_e12d12", "warmup")]["lr"], choices[("residual_iwslt_e12d12", "warmup")]["warmup"]) == (2e-3, 200)
    assert choices[("transformer_preln_iwslt_e12d12", "warmup")]["edges"] == []
    assert [r.seed for r in later] == [2, 2, 2]
    assert study_pairing.lr_text(args) == ("0.0005/0.001 (the others), own (ARCH_LRS): transformer_preln_iwslt_e12d12 "
                                                 "0.004, residual_iwslt_e12d12 0.002 (warm-up 200)")  # fmt: skip
    every = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--seeds", "1", "--arch-lrs",
                              "transformer_preln_iwslt_e12d12=4e-3"])  # fmt: skip
    assert study_pairing.lr_text(every) == "own (ARCH_LRS): transformer_preln_iwslt_e12d12 0.004"
    nowarm = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--variants", "nowarmup warmup",
                               "--arch-lrs", "transformer_preln_iwslt_e12d12=4e-3@100"])  # fmt: skip
    assert [(r.variant, r.warmup) for r in study.grid(nowarm)[0]] == [("nowarmup", 0), ("warmup", 100)]


def test_default_arch_lrs_follow_the_architectures_left_in_archs():
    """The main job's own settings stay with their models when ARCHS changes; a given ARCH_LRS is taken as it is."""
    d = study.Defaults(archs="transformer_preln_iwslt_e12d12 residual_iwslt_e12d12", seeds="1",
                       arch_lrs="transformer_preln_iwslt_e12d12=4e-3 residual_iwslt_e12d12=2e-3")  # fmt: skip
    assert study.parse_args([], d).arch_settings == {"transformer_preln_iwslt_e12d12": ([4e-3], None),
                                                     "residual_iwslt_e12d12": ([2e-3], None)}  # fmt: skip
    other = study.parse_args(["--archs", "transformer_postln_iwslt_e12d12 residual_iwslt_e12d12"], d)
    assert other.arch_settings == {"residual_iwslt_e12d12": ([2e-3], None)}
    assert study.parse_args(["--arch-lrs", ""], d).arch_settings == {}
    # LRS asks for a grid for every model: the defaults' own lrs would silently override it
    grid = study.parse_args(["--seeds", "1 2", "--lrs", "5e-4 1e-3"], d)
    assert grid.arch_settings == {} and {r.lr for r in study.grid(grid)[0]} == {5e-4, 1e-3}
    assert study.parse_args(["--warmups", "100 200", "--seeds", "1 2"], d).arch_settings["residual_iwslt_e12d12"] == ([2e-3], None)


def test_arch_lrs_lists_widen_one_models_grid():
    """A grid widened for one model (its best lr on the edge) beside the shared LRS grid, chosen the same way."""
    args = study.parse_args(["--archs", "transformer_preln_iwslt_e12d12 residual_iwslt_e12d12", "--seeds", "1 2",
                             "--lrs", "1e-3 2e-3", "--arch-lrs", "transformer_preln_iwslt_e12d12=1e-3,2e-3,4e-3@100,400"])  # fmt: skip
    tuning, _ = study.grid(args)
    pre = [(r.lr, r.warmup) for r in tuning if r.arch == "transformer_preln_iwslt_e12d12"]
    assert pre == [(1e-3, 100), (1e-3, 400), (2e-3, 100), (2e-3, 400), (4e-3, 100), (4e-3, 400)]
    assert [(r.lr, r.warmup) for r in tuning if r.arch == "residual_iwslt_e12d12"] == [(1e-3, 400), (2e-3, 400)]
    results = {r: {"valid_loss": 5.0 - r.lr * 100 - r.warmup / 1e4} for r in tuning}
    choice = study_stats.choose_settings(results, first_seed=1)[("transformer_preln_iwslt_e12d12", "warmup")]
    assert (choice["lr"], choice["warmup"]) == (4e-3, 400) and len(choice["candidates"]) == 6
    assert study_pairing.lr_text(args) == ("0.001/0.002 (the others), own (ARCH_LRS): transformer_preln_iwslt_e12d12 "
                                                 "0.001/0.002/0.004 (warm-up 100/400)")  # fmt: skip
    with pytest.raises(study_common.RecipeError, match="ARCH_LRS gives transformer_preln_iwslt_e12d12 warm-up 900"):
        study.parse_args(["--archs", "transformer_preln_iwslt_e12d12", "--seeds", "1 2", "--max-update", "800",
                          "--arch-lrs", "transformer_preln_iwslt_e12d12=1e-3@100,900"])  # fmt: skip



def test_a_variable_that_nearly_spells_one_of_the_study_is_named_not_silently_ignored():
    environ = {"SEED": "3", "MAX_UPDATES": "50", "LR": "2e-3", "PATH": "/bin", "OMP_NUM_THREADS": "1", "SEEDS": "1",
               "LANG": "C", "TERM": "xterm", "lowercase_seed": "1"}  # fmt: skip
    near = study_common.misspelt_variables(environ, (*study.ENV_VARS, "REPORT_ONLY"))
    assert near == [("LR", "LRS"), ("MAX_UPDATES", "MAX_UPDATE"), ("SEED", "SEEDS")]
