"""`python -m serving.export`, the exporter's command (its home: `serving.exports.export`)."""

from apputil.cli import execute
from serving.exports.export import main

__all__ = ["main"]

if __name__ == "__main__":
    execute(main)
