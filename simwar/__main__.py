"""``python -m simwar``: the same as the ``simwar`` command."""

import sys

from simwar.cli import main

sys.exit(main())
