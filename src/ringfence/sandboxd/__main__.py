"""Start the daemon; see the package docstring for the command line."""

import sys

if __package__:
    from ._main import main
else:  # run as a file: python3 -I -S /path/to/sandboxd/__main__.py --listen-fd N
    _here = __file__.rpartition("/")[0] or "."
    _parent, _, _name = _here.rpartition("/")
    sys.path.insert(0, _parent or "/")
    main = __import__(_name + "._main", fromlist=["main"]).main

sys.exit(main(sys.argv[1:]))
