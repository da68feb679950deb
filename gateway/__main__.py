"""``python -m gateway``: the same command line as the ``gateway`` script."""

from gateway.cli import main

main()
