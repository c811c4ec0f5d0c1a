"""``python -m eos_connectors.cli``: the ``eos`` command."""

import sys

from eos_connectors.cli import main

sys.exit(main())
