"""The pack job: its options (``config``: :class:`PackConfig`), the plan of sample lengths into
rows (``plan``), and its two runs: token lists in memory (``tokens``: :func:`pack_tokens`) and
token shards on disk (``files``: :func:`pack_files`, with its disk pre-flight ``diskspace``).
Every run takes one ``PackConfig`` and returns one ``PackReport``.
"""
