"""``python -m cutetma ...``: the same CLI as the ``cutetma`` command (``cutetma.cli``)."""

import sys

from cutetma.cli import main

if __name__ == "__main__":
    sys.exit(main())
