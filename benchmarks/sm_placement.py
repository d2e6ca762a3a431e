"""Where the H200 puts a persistent grid's CTAs: SM and GPC of every CTA index.

    python benchmarks/sm_placement.py [--out DIR] [--repeats 3]

The GEMM's static scheduler gives the CTA (cluster) with index i the tiles i, i + grid, ...,
so the tile -> SM map is the hardware's CTA -> SM map, and which CTAs share a GPC decides
how many of an operand's reads the L2 request coalescer merges (``cutetma.placement``).

Launches ``PlacementProbe`` (one CTA per SM, every CTA resident at once) with clusters of
16, 8 and 6 (a cluster's CTAs share a GPC: together they name the GPCs' SMs), then with the
grids the GEMM launches (132 and 128 CTAs alone, in pairs, fours and eights, the clusters
along z), each ``--repeats`` times. Writes ``sm_placement.json``: ``gpc_of_sm`` (-1 where no
cluster reached the SM) and per launch the SM, GPC and start time (ns after the first CTA's)
of each CTA index.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GRIDS = [(1, 132), (1, 128), (2, 132), (2, 128), (4, 128), (8, 128)]  # (cluster, CTAs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from cutetma import results
    from cutetma.runtime import placement
    from cutetma.runtime import sm_count as device_sm_count
    from cutetma.tuning.placement import gpcs_from_clusters

    sm_count = device_sm_count(0)
    launches, named = [], []
    plan = [(size, sm_count // size * size, 1) for size in placement.GPC_PROBE_CLUSTERS]
    plan += [(size, ctas, args.repeats) for size, ctas in GRIDS]
    for size, ctas, repeats in plan:
        for repeat in range(repeats):
            try:
                rows = placement.probe(size, ctas)
            except Exception as error:  # one launch the card refuses costs its rows only
                print(f"cluster {size} x {ctas // size}: {error!r}"[:300])
                continue
            if size in placement.GPC_PROBE_CLUSTERS and repeats == 1:
                named.append((size, [sm for sm, _, _ in rows]))
            t0 = min(r[2] for r in rows)
            launches.append({"cluster": size, "ctas": ctas, "repeat": repeat,
                             "sm": [r[0] for r in rows],
                             "start_ns": [(r[2] - t0) % 2**32 for r in rows]})
    gpc = gpcs_from_clusters(named, sm_count)
    for launch in launches:
        launch["gpc"] = [gpc[sm] for sm in launch["sm"]]
        print(f"cluster {launch['cluster']:2d} x {launch['ctas'] // launch['cluster']:3d}: GPCs",
              "".join("?" if g < 0 else chr(48 + g) for g in launch["gpc"]))
    sizes = {g: gpc.count(g) for g in sorted(set(gpc))}
    print("SMs per GPC (-1: no cluster reached them):", sizes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/sm_placement.py " + " ".join(argv or sys.argv[1:])
    doc = {"meta": results.meta(command), "sm_count": sm_count, "gpc_of_sm": gpc,
           "sms_per_gpc": sizes, "rows": launches}
    (out / "sm_placement.json").write_text(results.dumps(doc))
    print("wrote", out / "sm_placement.json", torch.cuda.get_device_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
