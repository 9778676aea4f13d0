"""Subcommands other than ``run``: each module exposes ``configure_parser`` and ``run``."""
