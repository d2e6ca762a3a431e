"""Pictures of the TMA model in ``cutetma.swizzle``: PNGs (``png``) for the docs and the CLI."""
