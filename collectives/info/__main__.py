"""python -m collectives.info: the environment report (see collectives/info/__init__.py)."""

import sys

from . import report

if __name__ == "__main__":
    sys.stdout.write(report())
    sys.exit(0)
