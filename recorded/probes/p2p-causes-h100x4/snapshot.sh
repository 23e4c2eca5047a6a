#!/bin/bash
# Build the device snapshot /work/main/.device/p2p from the worktree (working tree, not HEAD): $1 = round script
set -eu
W=/work/wt-p2p
D=/work/main/.device/p2p
rm -rf $D && mkdir -p $D
cd $W
tar -c --exclude=__pycache__ kit configs benchmarks notebooks examples pyproject.toml tests/conftest.py tests/test_p2p_transports.py tests/test_ipc_direct.py 2>/dev/null | tar -x -C $D
cp recorded/probes/p2p-causes-h100x4/*.py $D/
cp "$1" $D/run.sh
chmod +x $D/run.sh
du -sh $D
