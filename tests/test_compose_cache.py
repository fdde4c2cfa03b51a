"""tests/compose_cache.py: fairseq composes the same config with the caches as without them, a bad override is
refused alike, a cached parse is a new object each time, and the fork servers' lines install both caches."""

import subprocess
import sys

import pytest
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from . import compose_cache
from .helpers import PLUGIN_DIR, REPO

COMMANDS = {
    "train": (options.get_training_parser, ["data", "--user-dir", str(PLUGIN_DIR), "--arch", "residual_axes", "--cpu",
                                            "--depth-aggregation", "dca", "--lr", "1e-3", "--optimizer", "adam"]),
    "generate": (options.get_generation_parser, ["data", "--user-dir", str(PLUGIN_DIR), "--path", "x.pt", "--beam", "3"]),
}  # fmt: skip


def composed(name: str) -> str:
    make_parser, argv = COMMANDS[name]
    args = options.parse_args_and_arch(make_parser(), argv)
    return OmegaConf.to_yaml(convert_namespace_to_omegaconf(args))


@pytest.fixture
def uncached():
    compose_cache.uninstall()
    try:
        yield
    finally:
        compose_cache.install()


@pytest.mark.parametrize("name", COMMANDS)
def test_the_cached_composition_is_hydras(name, uncached):
    want = composed(name)
    compose_cache.install()
    assert composed(name) == composed(name) == want  # the second: every override from the cache


def test_a_bad_override_is_refused_alike_and_a_parse_is_a_new_object(uncached):
    parser = OverridesParser.create()
    with pytest.raises(Exception) as plain:
        parser.parse_overrides(["common.seed=[1"])
    compose_cache.install()
    for _ in range(2):
        with pytest.raises(type(plain.value)) as cached:
            parser.parse_overrides(["common.seed=[1"])
        assert str(cached.value) == str(plain.value)
    first, second = (parser.parse_overrides(["optimization.lr=[0.001]"])[0] for _ in range(2))
    assert first == second and first is not second and first.value() is not second.value()


def test_the_fork_servers_lines_install_both_caches():
    check = ("from hydra._internal.config_repository import CachingConfigRepository as R\n"
             "from hydra.core.override_parser.overrides_parser import OverridesParser as P\n"
             "assert (P.parse_rule.__name__, R.__init__.__name__) == "
             "('_cached_parse_rule', '_repository_init_sharing_the_store')\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", compose_cache.SERVER_LINES + check], cwd=REPO, check=True)
