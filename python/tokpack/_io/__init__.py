"""What every command shares at its edges: resolving inputs (``inputs``), converting user arrays
(``arrays``), atomic output directories with a manifest cache (``outdir``), the progress display
(``progress``) and plain-text tables (``tables``)."""
