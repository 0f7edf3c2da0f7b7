"""``python -m launcher ...``: the ``hetero-launch`` command (launcher/cli.py), for a venv whose scripts are not on
PATH."""

from launcher.cli import entry

entry()
