"""Moved to specdec.cli.peers (kept so `import peers` and `python benchmarks/peers.py` still work)."""
from specdec.cli.peers import *  # noqa: F403
from specdec.cli.peers import _main

if __name__ == "__main__":
    _main()
