#!/bin/sh
# The interpreter `make` builds its virtual environments with (the Makefile's PYTHON; set PYTHON to
# choose another): a Python 3.12 where the machine has one, on PATH or among pyenv's versions, else
# python3. moot runs on 3.11 and later, and mypy checks it as 3.11 (pyproject.toml); the suite runs
# on 3.12 where it can because coverage measures there with sys.monitoring, which 3.11 lacks: its
# trace function cost 33-43% more CPU than no coverage on the same tests, sys.monitoring 3-6%
# (tests/README.md, "Where the fast tier's time goes").
for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        echo "$candidate"
        exit 0
    fi
done
echo python3
