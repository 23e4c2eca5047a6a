#!/bin/bash
cd "$(dirname "$0")"
{ date -u; nvidia-smi; nvidia-smi topo -m; } > $OUT_DIR/machine.txt 2>&1
cp copyout.py $OUT_DIR/
timeout -k 3 90 python3 copyout.py $OUT_DIR 40
timeout -k 3 60 python3 copyout.py $OUT_DIR/.. 40 > $OUT_DIR/second.txt 2>&1; mv $OUT_DIR/../copyout.json $OUT_DIR/copyout-second.json 2>/dev/null
