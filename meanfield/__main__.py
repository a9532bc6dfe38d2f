"""``python -m meanfield``: the command line (see meanfield.cli)."""
import sys

from .cli import main

sys.exit(main())
