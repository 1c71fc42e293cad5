"""``python -m comlrl ...``: the ``comlrl`` command line."""

import sys

from comlrl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
