"""``python -m moot``: the command line, as the ``moot`` script runs it."""

from moot.cli.main import main

main()
