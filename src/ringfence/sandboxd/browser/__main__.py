"""Start the browser agent; see the package docstring for the command line."""

from __future__ import annotations

import sys

from ._main import main

sys.exit(main(sys.argv[1:]))
