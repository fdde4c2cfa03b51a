"""The training set-ups and the commands scripts/training/train_recipe.py plans from them, in-process (dry runs
need no GPU and no data): exact batches for any GPU and node count, the launchers, every value's source, the
fairness of a set-up across architectures, and the checks that stop a run that would silently differ from
its set-up (direction, dictionaries, multilingual data)."""

import json
import sys
import types
from pathlib import Path

import pytest

from scripts.training import fairseq_rank, setups, train_recipe
from scripts.training.training_common import RecipeError


def dry(arch: str, dataset: str, *options: str, env: dict | None = None, manifest: dict | None = None,
        tmp: Path | None = None, dry_run: bool = True, visible: int = 0) -> train_recipe.Plan:  # fmt: skip
    """Plan ``arch`` on ``dataset``: a name without data, or (``manifest``) a data directory with that recipe.json."""
    if manifest is not None:
        data = tmp / "data"
        data.mkdir(exist_ok=True)
        (data / "recipe.json").write_text(json.dumps(manifest), encoding="utf-8")
        dataset = str(data)
    args = train_recipe.parse_args([arch, dataset, *(["--dry-run"] if dry_run else []), *options])
    train_recipe.attach_save_dirs(args)
    setup, why = setups.choose_setup(args.hparams, args.archs[0])
    return train_recipe.plan(args, arch, setup, why, env=env or {}, visible=visible, read_data=manifest is not None)


def value(cmd: list[str], option: str) -> str | None:
    return train_recipe.last_value(cmd, option)


def tokens(p: train_recipe.Plan) -> int:
    cmd = p.command
    return int(value(cmd, "--max-tokens")) * int(value(cmd, "--update-freq")) * int(value(cmd, "--distributed-world-size") or 1)


# ------------------------------------------------------------------------------------------- batches


@pytest.mark.parametrize("tokens_per_update", [4096, 32768, 65536, 2048, 1000])
def test_split_is_exact_for_every_process_count_or_refused(tokens_per_update):
    for world in range(1, 129):
        for cap in (256, 4096):
            split = setups.split_batch(tokens_per_update, world, cap)
            if tokens_per_update % world:
                assert split is None
            elif split is not None:
                max_tokens, update_freq = split
                assert world * max_tokens * update_freq == tokens_per_update and max_tokens <= cap
                # no smaller accumulation would do: the largest exact batch per GPU under the cap
                assert all(tokens_per_update % (world * u) or tokens_per_update // (world * u) > cap
                           for u in range(1, update_freq))  # fmt: skip


def test_eight_gpus_on_iwslt_keep_4096_tokens_per_update():
    p = dry("residual_iwslt_e6d6", "iwslt14_en_de", "--gpus", "8")
    assert (value(p.command, "--max-tokens"), value(p.command, "--update-freq")) == ("512", "1")
    assert tokens(p) == p.tokens_per_update == 4096 and any("lowered from 4096 to 512" in n for n in p.notes)
    assert any("8 GPU(s) per node (this machine has 0" in a for a in p.assumed)
    for gpus, expected in ((0, ("4096", "1")), (1, ("4096", "1")), (2, ("2048", "1"))):
        p = dry("residual_iwslt_e6d6", "iwslt14_en_de", "--gpus", str(gpus))
        assert (value(p.command, "--max-tokens"), value(p.command, "--update-freq")) == expected
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "2")  # 65,536 tokens: 2 x 4096 x 8
    assert (value(p.command, "--max-tokens"), value(p.command, "--update-freq"), tokens(p)) == ("4096", "8", 65536)


@pytest.mark.parametrize("gpus,nodes", [(1, 1), (2, 1), (8, 1), (8, 2), (8, 4), (4, 16), (3, 1), (6, 2), (5, 5)])
def test_tokens_per_update_stay_exact_over_nodes_and_gpus(gpus, nodes):
    options = ("--gpus", str(gpus), "--nodes", str(nodes))
    world = gpus * nodes
    for setup, dataset, name in (("residual-paper", "wmt14_en_de", "wmt14_de_en"),
                                 ("crossformer-paper", "iwslt14", "iwslt14_de_en")):  # fmt: skip
        want = setups.SETUPS[setup][dataset]["tokens_per_update"].value
        if want % world:
            with pytest.raises(RecipeError) as err:
                dry("transformer_preln_e6d6", name, "--hparams", setup, *options)
            for part in ("NUM_GPUS", "NUM_NODES", "TOKENS_PER_UPDATE", "MAX_TOKENS", "1, 2, 4, 8"):
                assert part in str(err.value)
        else:
            p = dry("transformer_preln_e6d6", name, "--hparams", setup, *options)
            assert tokens(p) == want and value(p.command, "--distributed-world-size") == (str(world) if world > 1 else None)


def test_user_batch_options_keep_the_split_exact():
    p = dry("residual_iwslt_e6d6", "iwslt14_en_de", "--gpus", "2", "--max-tokens", "1000")
    assert (value(p.command, "--max-tokens"), value(p.command, "--update-freq")) == ("512", "4")
    assert "--max-tokens (MAX_TOKENS) (user" in p.rows["max_tokens"].source
    p = dry("residual_iwslt_e6d6", "iwslt14_en_de", "--gpus", "3", "--tokens-per-update", "6144")
    assert tokens(p) == 6144 and "TOKENS_PER_UPDATE" in p.rows["tokens_per_update"].source
    p = dry("residual_iwslt_e6d6", "iwslt14_en_de", "--", "--update-freq", "3")
    assert tokens(p) == 3 * 4096 and any("DEVIATION" in n and "12288" in n for n in p.notes)
    assert any("overrides the recipe's --update-freq" in n for n in p.notes)


# ------------------------------------------------------------------------------------------ launchers


def test_one_process_runs_fairseq_train_itself():
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "1")
    assert p.launcher == "single" and p.command[1:3] == ["-m", "fairseq_cli.train"]
    assert "--distributed-world-size" not in p.command and "--cpu" not in p.command


def test_torchrun_standalone_on_one_node_and_per_node_command_on_several(tmp_path):
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "8")
    assert p.command[1:8] == ["-m", "torch.distributed.run", "--nproc-per-node", "8", "--standalone",
                              "-m", train_recipe.RANK_MODULE]  # fmt: skip
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--nodes", "4")
    assert value(p.command, "--nnodes") == "4" and value(p.command, "--node-rank") == "${NODE_RANK}"
    assert value(p.command, "--master-port") == "${MASTER_PORT:-29500}" and value(p.command, "--distributed-world-size") == "32"
    line = train_recipe.render(p.command)
    assert "--node-rank ${NODE_RANK} --master-addr ${MASTER_ADDR}" in line  # left to the shell on each node
    assert any("NODE_RANK=0..3" in n for n in p.notes)
    env = {"NODE_RANK": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--nodes", "4", env=env)
    assert [value(p.command, o) for o in ("--node-rank", "--master-addr", "--master-port")] == ["2", "10.0.0.1", "1234"]
    with pytest.raises(RecipeError, match="set NODE_RANK on every node"):
        dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--nodes", "4", dry_run=False, manifest={
            "dataset": "wmt14_en_de", "source_lang": "de", "target_lang": "en"}, tmp=tmp_path, visible=8)
    with pytest.raises(RecipeError, match="only 0 CUDA device"):  # a real run checks the GPUs, a dry run plans
        dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", dry_run=False, manifest={
            "dataset": "wmt14_en_de", "source_lang": "de", "target_lang": "en"}, tmp=tmp_path)


def test_cpu_processes_use_gloo_under_torchrun(tmp_path):
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "0", "--cpu-procs", "2")
    assert p.launcher == "torchrun" and value(p.command, "--distributed-backend") == "gloo"
    assert value(p.command, "--ddp-backend") == "legacy_ddp" and "--cpu" in p.command
    with pytest.raises(RecipeError, match="CPU_PROCS"):
        dry("residual_e6d6", "wmt14_de_en", "--gpus", "1", "--cpu-procs", "2")


def test_inside_slurm_srun_with_fairseqs_own_detection():
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2"}
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--nodes", "2", env=env)
    assert p.launcher == "slurm" and p.command[:5] == ["srun", "--nodes", "2", "--ntasks-per-node", "8"]
    assert p.command[6:8] == ["-m", "fairseq_cli.train"] and "--distributed-init-method" not in p.command
    assert value(p.command, "--distributed-world-size") == "16" and value(p.command, "--distributed-port") == "29500"
    assert tokens(p) == 65536
    p = dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--launcher", "slurm")
    assert p.launcher == "slurm"
    with pytest.raises(RecipeError, match="SLURM_NNODES=2"):
        dry("residual_e6d6", "wmt14_de_en", "--gpus", "8", "--nodes", "4", env=env)
    with pytest.raises(RecipeError, match="one process per node"):
        dry("residual_e6d6", "wmt14_de_en", "--gpus", "1", "--nodes", "2", env={"SLURM_JOB_ID": "1"})


def test_the_rank_wrapper_passes_torchruns_variables_and_guards_the_world_size():
    argv = ["data", "--distributed-world-size", "2"]
    out = fairseq_rank.rank_arguments(argv, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert out[len(argv):] == ["--distributed-init-method", "env://", "--distributed-rank", "1", "--device-id", "1",
                               "--distributed-no-spawn"]  # fmt: skip
    with pytest.raises(SystemExit, match="WORLD_SIZE=4 .* --distributed-world-size 2"):
        fairseq_rank.rank_arguments(argv, {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    with pytest.raises(SystemExit, match="start this with torchrun"):
        fairseq_rank.rank_arguments(argv, {})


# ----------------------------------------------------------------------------------- set-ups, sources


def test_the_set_up_is_chosen_once_and_said():
    assert setups.choose_setup("auto", "crossformer_sg_e6d6")[0] == "crossformer-paper"
    assert setups.choose_setup("auto", "transformer_preln_e6d6")[0] == "residual-paper"
    assert setups.choose_setup("paper", "dca_k2_e6d6")[0] == "dca"
    assert setups.choose_setup("authors", "residual_e6d6")[0] == "residual-authors"
    assert setups.choose_setup("crossformer-paper", "residual_e6d6") == ("crossformer-paper", "HPARAMS=crossformer-paper")
    assert setups.choose_setup("crossformer", "residual_e6d6")[0] == "crossformer-paper"  # the earlier names still work
    with pytest.raises(RecipeError, match="released no NMT configuration"):
        setups.choose_setup("authors", "crossformer_hg_e6d6")
    with pytest.raises(RecipeError, match="allowed auto, paper, authors, residual-paper"):
        setups.choose_setup("vaswani", "residual_e6d6")
    with pytest.raises(RecipeError, match="set-ups for opus100: residual-paper, residual-authors, dca"):
        dry("crossformer_hg_e6d6", "opus100")


def test_dry_run_prints_every_value_with_its_source_and_the_command(capsys):
    train_recipe.main(["residual_iwslt_e6d6,transformer_preln_iwslt_e6d6", "iwslt14_en_de", "--dry-run", "--gpus", "8"],
                      env={})  # fmt: skip
    out = capsys.readouterr().out
    for name in setups.FIELDS:
        assert f"  {name} " in out
    assert "ResiDual table 9" in out and "hydra_config/iwslt.yaml" in out and "assumed: no data at" in out
    assert out.count("# residual_iwslt_e6d6: command; 4096 tokens per update (8 x 512 x 1)") == 1
    assert "# transformer_preln_iwslt_e6d6: command" in out and "HPARAMS=auto" in out
    with pytest.raises(RecipeError, match="name must be one of iwslt14"):
        train_recipe.main(["residual_e6d6", "somewhere_else", "--dry-run"], env={})
    with pytest.raises(RecipeError, match="no data directory"):
        train_recipe.main(["residual_e6d6", "iwslt14_de_en"], env={})


def test_the_manifest_holds_every_value_and_source(tmp_path):
    p = dry("residual_e6d6", "wmt14_en_de", "--hparams", "residual-authors")
    args = train_recipe.parse_args(["residual_e6d6", "wmt14_en_de"])
    record = json.loads(json.dumps(train_recipe.manifest_of(p, args)))
    assert set(record["values"]) == set(setups.FIELDS)
    assert record["values"]["max_update"] == {"value": 50000, "source": "ResiDual authors' hydra_config/wmt.yaml (the paper: 500k)"}
    assert record["values"]["direction"]["value"] == ["en", "de"] and record["tokens_per_update"] == 65536


@pytest.mark.parametrize("setup", ["residual-paper", "residual-authors", "dca"])
@pytest.mark.parametrize("dataset", ["iwslt14", "wmt14_en_de", "opus100"])
def test_residual_set_ups_have_the_authors_attention_and_activation_dropout(setup, dataset):
    p = dry("residual_e6d6", train_recipe.golden_name(setup, dataset), "--hparams", setup)
    assert value(p.command, "--attention-dropout") == value(p.command, "--activation-dropout") == "0.1"
    assert "the authors' configs" in p.rows["attention_dropout"].source or "hydra_config" in p.rows["attention_dropout"].source


def test_paper_and_authors_values():
    p = dry("residual_iwslt_e12d12", "iwslt14_en_de", "--gpus", "1")
    c = p.command
    assert [value(c, o) for o in ("--lr", "--warmup-updates", "--dropout", "--max-update", "--weight-decay",
                                  "--clip-norm")] == ["0.0005", "4000", "0.3", "300000", "0.0001", "0.0"]  # fmt: skip
    assert "--fp16" in c and value(c, "--dual-residual-scale") == "0.05" and "--share-all-embeddings" in c
    c = dry("residual_iwslt_e6d6", "iwslt14_de_en", "--hparams", "authors", "--gpus", "1").command
    assert "--fp16" not in c and "--dual-residual-scale" not in c and value(c, "--patience") == "20"
    assert value(c, "--eval-bleu-args") == '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}'
    assert value(c, "--best-checkpoint-metric") == "bleu" and "--maximize-best-checkpoint-metric" in c
    assert value(c, "--max-update") == "500000"
    c = dry("residual_e6d6", "wmt14_en_de", "--hparams", "authors", "--gpus", "1").command
    assert "--amp" in c and value(c, "--keep-last-epochs") == "10" and "--no-epoch-checkpoints" not in c
    assert value(c, "--max-update") == "50000"
    c = dry("residual_e18d18", "opus100", "--hparams", "authors", "--gpus", "1").command
    assert [value(c, o) for o in ("--lr", "--warmup-updates", "--clip-norm", "--weight-decay", "--seed",
                                  "--max-source-positions", "--fp16-init-scale", "--dual-residual-scale", "--task")] == [
        "0.004", "8000", "1.0", "0.0", "1379", "256", "8", "0.05", "translation_multi_simple_epoch"]  # fmt: skip
    assert "--memory-efficient-fp16" in c and "--share-decoder-input-output-embed" in c and "--share-all-embeddings" not in c
    c = dry("crossformer_hg_e6d6", "wmt14_en_fr").command
    assert [value(c, o) for o in ("--lr", "--max-update", "--dropout", "--weight-decay", "--keep-interval-updates")] == [
        "0.0007", "60000", "0.1", "0.0", "5"]  # fmt: skip


def test_fp16_on_cpu_and_the_dual_residual_scale():
    c = dry("residual_e36d6", "wmt14_de_en", "--fp16", "1").command
    assert "--fp16" in c and "--fp16-no-flatten-grads" in c and value(c, "--dual-residual-scale") == "0.05"
    c = dry("transformer_preln_e36d6", "wmt14_de_en", "--fp16", "1").command
    assert "--fp16" in c and "--dual-residual-scale" not in c
    c = dry("residual_e36d6", "wmt14_de_en", "--fp16", "1", "--", "--dual-residual-scale", "0.1").command
    assert value(c, "--dual-residual-scale") == "0.1" and c.count("--dual-residual-scale") == 1
    p = dry("residual_e36d6", "wmt14_de_en")
    assert p.precision == "fp32" and "--fp16" not in p.command and any("on CPU" in n for n in p.notes)


def test_dca_weight_decay_is_a_set_up_its_baseline_gets_too():
    for arch in ("dca_e6d6", "transformer_preln_e6d6"):
        p = dry(arch, "wmt14_de_en", "--hparams", "dca")
        assert value(p.command, "--weight-decay") == "0.1" and "DeepCrossAttention sec. 5" in p.rows["weight_decay"].source
    assert value(dry("transformer_preln_e6d6", "wmt14_de_en").command, "--weight-decay") == "0.0001"


def strip_arch(p: train_recipe.Plan) -> list[str]:
    """The command without --arch, --save-dir and the model's own options (the only allowed differences)."""
    cmd = list(p.command)
    for option in ("--arch", "--save-dir"):
        i = cmd.index(option)
        del cmd[i : i + 2]
    return cmd[: len(cmd) - 1 - cmd[::-1].index("--criterion")]


@pytest.mark.parametrize("setup", setups.SETUPS_ORDER)
def test_a_set_up_gives_every_family_the_same_command(setup):
    dataset = "wmt14_en_de"
    name = train_recipe.golden_name(setup, dataset)
    archs = train_recipe.family_representatives("512/2048/8").values()
    commands = {arch: strip_arch(dry(arch, name, "--hparams", setup, "--gpus", "8")) for arch in archs}
    assert len({tuple(c) for c in commands.values()}) == 1, commands


# ------------------------------------------------------------------------------ data the set-up needs


def test_a_direction_other_than_the_set_ups_stops_unless_asked(tmp_path):
    manifest = {"dataset": "iwslt14", "source_lang": "de", "target_lang": "en", "joined_dictionary": True}
    with pytest.raises(RecipeError) as err:
        dry("residual_iwslt_e6d6", "", manifest=manifest, tmp=tmp_path)
    assert "SRC=en TGT=de bash recipes/prepare_iwslt14.sh" in str(err.value) and "DIRECTION=data" in str(err.value)
    p = dry("residual_iwslt_e6d6", "", "--direction", "data", manifest=manifest, tmp=tmp_path)
    assert value(p.command, "--source-lang") == "de" and any(n.startswith("DEVIATION: trains de->en") for n in p.notes)
    p = dry("residual_iwslt_e6d6", "", "--hparams", "authors", manifest=manifest, tmp=tmp_path)
    assert not p.notes or not any("DEVIATION" in n for n in p.notes)
    with pytest.raises(RecipeError, match="the data is en->de but the set-up trains de->en"):
        dry("residual_e6d6", "wmt14_en_de")  # the data-bin name says the direction in a dry run too


def test_crossformer_iwslt_is_base_width_with_separate_embeddings(tmp_path):
    p = dry("crossformer_sg_e6d6", "iwslt14_de_en")
    c = p.command
    assert "--share-decoder-input-output-embed" in c and "--share-all-embeddings" not in c
    assert value(c, "--criterion") == "label_smoothed_cross_entropy_with_guidance" and value(c, "--guidance-weight") == "0.01"
    assert value(c, "--max-update") == "50000" and p.rows["width"].value == "512/2048/8"
    assert any("joined source/target dictionary" in a for a in p.assumed)
    narrow = dry("crossformer_sg_iwslt_e6d6", "iwslt14_de_en")
    assert any("has width 256/1024/4; the set-up was run at 512/2048/8" in n for n in narrow.notes)
    joined = {"dataset": "iwslt14", "source_lang": "de", "target_lang": "en", "joined_dictionary": True}
    p = dry("crossformer_sg_e6d6", "", manifest=joined, tmp=tmp_path)
    assert any("the data has a joined dictionary" in n for n in p.notes)
    separate = {**joined, "joined_dictionary": False}
    p = dry("crossformer_sg_e6d6", "", manifest=separate, tmp=tmp_path)
    assert not any("dictionary" in n for n in p.notes)
    with pytest.raises(RecipeError, match="needs one joined dictionary.*joined_dictionary false"):
        dry("residual_iwslt_e6d6", "", "--hparams", "authors", manifest=separate, tmp=tmp_path)


def test_opus100_trains_fairseqs_multilingual_task(tmp_path, monkeypatch):
    p = dry("residual_e18d18", "opus100")
    assert value(p.command, "--task") == "translation_multi_simple_epoch" and "--source-lang" not in p.command
    assert any("scripts/training/multilingual.py" in a for a in p.assumed)
    old = {"dataset": "opus100", "source_lang": "src", "target_lang": "tgt"}
    with pytest.raises(RecipeError, match="prepare it again with recipes/prepare_opus100.sh"):
        dry("residual_e18d18", "", manifest=old, tmp=tmp_path)
    fake = types.ModuleType("multilingual")
    fake.train_args = lambda manifest: ["--task", manifest["task"], "--lang-pairs", "de-en,en-de"]
    monkeypatch.setitem(sys.modules, "scripts.training.multilingual", fake)
    new = {**old, "task": "translation_multi_simple_epoch", "joined_dictionary": True}
    p = dry("residual_e18d18", "", manifest=new, tmp=tmp_path)
    assert value(p.command, "--lang-pairs") == "de-en,en-de" and value(p.command, "--task") == "translation_multi_simple_epoch"


def test_every_planned_command_parses_with_fairseqs_own_parser():
    from fairseq import options

    for setup in setups.SETUPS_ORDER:
        for dataset in setups.SETUPS[setup]:
            if dataset == "opus100":  # the multilingual task's options come from the prepared data
                continue
            for arch in ("residual_e6d6", "crossformer_sg_e6d6"):
                cmd = dry(arch, train_recipe.golden_name(setup, dataset), "--hparams", setup, "--gpus", "1").command
                fairseq_args = cmd[3:]
                i = fairseq_args.index("--user-dir")
                del fairseq_args[i : i + 2]  # the plugin is imported already
                args = options.parse_args_and_arch(options.get_training_parser(), input_args=fairseq_args)
                assert args.arch == arch and args.max_tokens == int(value(cmd, "--max-tokens"))
