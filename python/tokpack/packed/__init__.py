"""The packed directory, ``tokpack pack``'s product: its format (``format``: the names, the
manifest and the dropped list; ``manifest.schema.json``), its reader (``reader``), its checks
(``integrity``: ``tokpack verify``), its per-row counts (``row_counts``), the reading order of an
epoch (``order``), mixtures of several directories (``mixture``) and the export to Megatron-LM
and NeMo (``export``). Nothing here imports torch.
"""
