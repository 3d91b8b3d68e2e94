"""`python -m serving.server`, the local server's command (its home: `serving.local.server`)."""

from apputil.cli import execute
from serving.local.server import main

__all__ = ["main"]

if __name__ == "__main__":
    execute(main)
