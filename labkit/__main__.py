"""`python -m labkit COMMAND ...`: the kit's command line (labkit/cli/, one module per group of commands)."""
import sys

from labkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
