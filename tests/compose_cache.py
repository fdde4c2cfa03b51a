"""Two caches for fairseq's config composition in the test processes and in the commands the fork servers fork.

Every fairseq command composes its config with hydra (``convert_namespace_to_omegaconf``): ~0.35 s of CPU warm,
about half of a forked 4-update training of a tiny model, and the suite runs hundreds. Two of its steps redo work
whose result is the same every time, and are cached here; composition is otherwise hydra's own:
- hydra's override parser (ANTLR, ~0.065 s for the ~260 overrides of a command) parses each override string once
  per process: a command's overrides are mostly the defaults of every option, the same from command to command.
  A deep copy of the parsed override is returned, as a new parse would return a new object; a string that does
  not parse is parsed (and refused) every time.
- ``CachingConfigRepository`` deep-copies the config repository it wraps (~0.07 s), and with it hydra's
  ``ConfigStore`` of every registered dataclass config: the copy shares that store instead. Hydra copies "to avoid
  mutating it with initialize_sources()", which replaces the copy's sources, and a new structured source reads
  ``ConfigStore.instance()``, the same store; reading a config from the store returns a deep copy of it. So the
  copy sharing the store composes what the copy of the store composed; tests/test_compose_cache.py checks it.

The fork servers import nothing of this repository: they run this file (SERVER_LINES) before their warm-up
composition, so the commands they fork start with the parses of a command's default overrides."""

import copy
from pathlib import Path

from hydra._internal.config_repository import CachingConfigRepository
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser

UNCACHED = {"parse_rule": OverridesParser.parse_rule, "repository_init": CachingConfigRepository.__init__}
PARSED: dict = {}  # (override string, grammar rule) -> its parse


def _cached_parse_rule(self, s, rule_name):
    key = (s, rule_name)
    if key not in PARSED:
        PARSED[key] = UNCACHED["parse_rule"](self, s, rule_name)
    return copy.deepcopy(PARSED[key])


def _repository_init_sharing_the_store(self, delegate):
    # hydra's CachingConfigRepository.__init__ (two lines, no hook to share one object in its deep copy), the store
    # given to deepcopy's memo as its own copy
    store = ConfigStore.instance()
    self.delegate = copy.deepcopy(delegate, {id(store): store})
    self.cache = {}


def install() -> None:
    OverridesParser.parse_rule = _cached_parse_rule
    CachingConfigRepository.__init__ = _repository_init_sharing_the_store


def uninstall() -> None:
    OverridesParser.parse_rule = UNCACHED["parse_rule"]
    CachingConfigRepository.__init__ = UNCACHED["repository_init"]


# the fork servers' lines: this file run in a namespace of its own, then install()
SERVER_LINES = (f"compose_cache = {{'__name__': 'compose_cache', '__file__': {str(Path(__file__))!r}}}\n"
                "exec(compile(open(compose_cache['__file__']).read(), compose_cache['__file__'], 'exec'), compose_cache)\n"
                "compose_cache['install']()\n")  # fmt: skip
