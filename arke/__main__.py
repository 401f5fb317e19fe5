"""``python -m arke``: the same as the ``akc`` command."""

import sys

from arke.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
