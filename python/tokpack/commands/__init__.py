"""Subcommands of the ``tokpack`` CLI, one module each (``_ray``: the ``--ray`` of ``pack`` and
``tokenize``)."""
