"""``python -m arke``: the same as the ``akc`` command."""

import sys

from arke.cli import main

sys.exit(main())
