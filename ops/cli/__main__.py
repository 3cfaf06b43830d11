"""`python -m ops.cli`: the `memstream` command."""

import sys

from ops.cli import main

if __name__ == "__main__":  # not when imported as ops.cli.__main__ (walking the package's modules)
    sys.exit(main())
