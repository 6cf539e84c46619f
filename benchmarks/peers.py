"""Moved to specdec.bench.peers (kept so `import peers` and `python benchmarks/peers.py` still work)."""
from specdec.bench.peers import *  # noqa: F403
from specdec.bench.peers import _main

if __name__ == "__main__":
    _main()
