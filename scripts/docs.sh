#!/usr/bin/env bash
# Build the documentation site in strict mode (any warning fails): mkdocs.yml,
# docs/*.md and the API reference from keras_antisym's docstrings. Installs
# nothing: it needs the docs extra (pip install -e ".[docs]"). The site goes to
# site/ (git ignores it), or to the folder SITE_DIR names; it is kept, to open
# site/index.html in a browser (`mkdocs serve` serves it live instead).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    PYTHON=.venv/bin/python
else
    PYTHON=python
fi
site="${SITE_DIR:-site}"
"$PYTHON" -m mkdocs build --strict --site-dir "$site" "$@"
echo "docs: built in strict mode into $site (open $site/index.html, or run: $PYTHON -m mkdocs serve)"
