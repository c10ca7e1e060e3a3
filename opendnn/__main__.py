"""``python -m opendnn``: the ``opendnn`` command (``opendnn.apps.cli``), for environments without
the console script on PATH."""

import sys

from opendnn.apps.cli import main

if __name__ == "__main__":
    sys.exit(main())
