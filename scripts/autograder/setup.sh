#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): it
# installs Python and bubblewrap (the sandbox), then this project (not editable, with its
# `test` extra) into a virtual environment beside this file, /autograder/source/.venv.
# DILOCO_NO_APT=1 skips the apt-get step (a machine that has python3-venv and bwrap already).
set -euo pipefail
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -z "${DILOCO_NO_APT:-}" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip bubblewrap
fi
python3 -m venv "$SOURCE/.venv"
"$SOURCE/.venv/bin/python" -m pip install --quiet --upgrade pip
"$SOURCE/.venv/bin/python" -m pip install --quiet "$SOURCE[test]"
chmod -R a+rX "$SOURCE/.venv"  # the sandbox's user needs the interpreter and NumPy
