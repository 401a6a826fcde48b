"""``python -m simwar``: the same as the ``simwar`` command."""

import sys

from .cli import main

sys.exit(main())
