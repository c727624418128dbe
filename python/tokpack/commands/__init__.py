"""Subcommands of the ``tokpack`` CLI, one module each."""
