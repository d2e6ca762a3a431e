"""Data movement as building blocks, one mechanism per module, one interface over them.

* ``tma``     -- TMA atoms (2D and 3D grouped boxes, every swizzle mode, multicast), the
                 expect-tx byte count, TMA stores with commit / wait group.
* ``cpasync`` -- 16-byte cp.async (LDGSTS) tiled copies into the *same* swizzled layout:
                 the swizzle is applied in software through the same CuTe layout.
* ``loader``  -- ``Loader``: the one interface kernels use, so the mechanism is a parameter
                 (``load="tma" | "cp_async"``; multicast is a cluster, not a mechanism) and
                 never a copied kernel.

These are trace-time helpers: call them inside ``@cute.jit`` / ``@cute.kernel`` code.
"""

LOAD_MECHANISMS = ("tma", "cp_async")
