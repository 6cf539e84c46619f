"""Do a tree verification's logits equal one-token steps along a path, bit for bit? (one engine, CPU)

    python benchmarks/tree_exactness.py --engine ENGINE --context 100,300

For each tree (chains of 3 and 7 rows; a branch whose path is the call's first rows; paths that skip one sibling row,
and two or three), the engine prefills ``--context`` tokens, verifies the tree in one call, then decodes the path's
tokens one step at a time on a fresh cache, and prints the largest |difference| of the path's logits per row: 0 where
the two agree bit for bit. Exits 1 if any row differs.
"""

from __future__ import annotations

import argparse

import numpy as np

TREES = {  # the call's tokens (row 0: the last token), each row's parent (-1: none), the path compared
    "chain of 3": ([11, 12, 13], [-1, 0, 1], [0, 1, 2]),
    "chain of 7": ([11, 12, 13, 14, 15, 16, 17], [-1, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]),
    "branch, the path first": ([11, 12, 13, 99], [-1, 0, 1, 0], [0, 1, 2]),
    "path skips one sibling row": ([11, 12, 99, 13], [-1, 0, 0, 1], [0, 1, 3]),
    "wide: path skips 2, then 1 rows": ([11, 50, 51, 52, 12, 53, 13], [-1, 0, 0, 0, 1, 1, 4], [0, 1, 4, 6]),
}


def main() -> None:
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends import Placement, open_executor

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True, help="an engine built with --tree_attention (or a Medusa / EAGLE target)")
    ap.add_argument("--context", default="100,300", help="tokens in the cache before the tree (comma list)")
    args = ap.parse_args()
    ex = open_executor(load_engine_dir(args.engine), Placement("cpu", 0))
    differ = False
    for length in (int(c) for c in args.context.split(",")):
        prompt = [(7 * i) % 500 + 10 for i in range(length)]
        for name, (tokens, parents, path) in TREES.items():
            tree = ex.new_cache(1)
            ex.forward(tree, [prompt], all_logits=False)
            # copies: an executor's outputs may live in a buffer its next call reuses
            wide = np.array(ex.forward(tree, [tokens], all_logits=True, parents=[np.array(parents)]).logits[0])[path]  # [len(path), vocab]
            steps = ex.new_cache(1)
            ex.forward(steps, [prompt], all_logits=False)
            narrow = np.stack([np.array(ex.forward(steps, [[tokens[i]]], all_logits=True).logits[0, 0]) for i in path])
            diff = np.abs(wide - narrow).max(axis=-1)
            differ |= bool(diff.any())
            print(f"context {length}, {name}: largest |difference| along the path {np.array2string(diff, precision=3)}"
                  + (" (bit for bit)" if not diff.any() else ""), flush=True)
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
