#!/usr/bin/env bash
# Build the documentation site in strict mode (any warning fails): mkdocs.yml,
# docs/*.md and the API reference from keras_antisym's docstrings. Installs
# nothing: it needs the docs extra (pip install -e ".[docs]"). The site goes to a
# temporary folder, removed afterwards, unless SITE_DIR names one to keep.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    PYTHON=.venv/bin/python
else
    PYTHON=python
fi
if [ -n "${SITE_DIR:-}" ]; then
    site="$SITE_DIR"
else
    site="$(mktemp -d)"
    trap 'rm -rf "$site"' EXIT
fi
"$PYTHON" -m mkdocs build --strict --site-dir "$site" "$@"
echo "docs: built in strict mode into $site"
