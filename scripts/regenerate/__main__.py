"""``python -m scripts.regenerate [--check]``: see the package's docstring."""

import sys

from .targets import main

sys.exit(main())
