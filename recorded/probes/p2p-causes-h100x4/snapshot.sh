#!/bin/bash
# Build the device snapshot /work/main/.device/p2p from the worktree (working tree, not HEAD): $1 = round script
set -eu
W=/work/wt-p2p
FINAL=/work/main/.device/p2p
D=$FINAL.new
rm -rf $D && mkdir -p $D
cd $W
tar -c --exclude=__pycache__ kit configs benchmarks notebooks examples pyproject.toml tests/conftest.py tests/exps.py \
    tests/test_p2p_transports.py tests/test_ipc_direct.py | tar -x -C $D
cp recorded/probes/p2p-causes-h100x4/*.py $D/
# pytest and its pure-Python dependencies, used only when the GPU machine has no pytest
SP=$(/work/main/.venv/bin/python -c "import pytest, os; print(os.path.dirname(os.path.dirname(pytest.__file__)))")
mkdir -p $D/pylib
for p in pytest _pytest pluggy iniconfig packaging py.py; do [ -e $SP/$p ] && cp -r $SP/$p $D/pylib/; done
find $D/pylib -name __pycache__ -prune -exec rm -rf {} +
cp "$1" $D/run.sh
chmod +x $D/run.sh
[ -n "${2:-}" ] && touch $D/$2   # READY-rN
rm -rf $FINAL.old; [ -d $FINAL ] && mv $FINAL $FINAL.old; mv $D $FINAL; rm -rf $FINAL.old
du -sh $FINAL
