"""`python -m exactdraft`: the same command as `exactdraft`."""

import sys

from exactdraft.cli import main

if __name__ == "__main__":
    sys.exit(main())
