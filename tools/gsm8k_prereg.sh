#!/usr/bin/env bash
# The pre-registered GSM8K run of issue 42 (docs/results/preregistration/gsm8k.md): 300 items no
# run has used, on Qwen2.5-Coder-1.5B-Instruct, in the registered stages. Re-running the script
# resumes: it restores the committed snapshot when this machine has no runs/gsm8k-prereg, then runs
# each stage in turn (a finished stage costs no call: its results are in the store).
#   bash tools/gsm8k_prereg.sh             # the stages, in the background (log: runs/gsm8k-prereg.log)
#   THREADS=1 bash tools/gsm8k_prereg.sh   # llama.cpp threads (default 2: both cores, nothing else running)
#   NICE=0 bash tools/gsm8k_prereg.sh      # its priority (default nice 15: other work on the machine goes first)
#   bash tools/gsm8k_prereg.sh snapshot    # what it finished, gzipped into docs/results/gsm8k-prereg/ (to commit),
#                                          # lean: the cached replies without their top-10 alternatives per token
#                                          # (no analysis reads them; the whole store would pass 100 MB gzipped)
#   bash tools/gsm8k_prereg.sh status      # items finished per arm
set -euo pipefail
cd "$(dirname "$0")/.."
MOOT=${MOOT:-.venv/bin/moot}
RUN=runs/gsm8k-prereg
SNAPSHOT=docs/results/gsm8k-prereg/run.sqlite.gz
O="wording=du,confidence=false"  # every arm: Du et al.'s wording, no confidence asked or shown
SOM="society-of-minds($O)"
TOGETHER="society-of-minds(history=together,$O)"
FREE="free-mad($O)"
STAGE1="single($O),vote@3($O),$SOM,usc(k=3,$O),society-of-minds($O,decide=select)"
STAGE2="$STAGE1,$TOGETHER,$FREE"
STAGE3="$STAGE2"
for d in "$SOM" "$TOGETHER" "$FREE"; do STAGE3="$STAGE3,vote@auto(by=tokens,ref=$d,$O)"; done

case "${1:-run}" in
    snapshot)
        [ -f "$RUN/run.sqlite" ] || { echo "error: $RUN/run.sqlite does not exist: nothing to snapshot" >&2; exit 2; }
        mkdir -p "$(dirname "$SNAPSHOT")"
        exec .venv/bin/python tools/snapshot_run.py --lean "$RUN" "$SNAPSHOT" ;;
    status)
        [ -f "$RUN/run.sqlite" ] || { echo "error: $RUN/run.sqlite does not exist" >&2; exit 2; }
        exec sqlite3 "$RUN/run.sqlite" "SELECT protocol, count(*) FROM results GROUP BY protocol" ;;
    run) ;;
    *) echo "error: no command $1; usage: $0 run|snapshot|status (run is the default)" >&2; exit 2 ;;
esac
if [ ! -f "$RUN/run.sqlite" ] && [ -f "$SNAPSHOT" ]; then
    mkdir -p "$RUN" && gunzip -c "$SNAPSHOT" > "$RUN/run.sqlite"
    echo "restored $RUN from $SNAPSHOT"
fi
stage() {
    # A stage the stored run has grown past (its protocols begin with the stage's, then more) is done
    # or finished by the later stage, which runs the same arms: `moot eval` would refuse to shrink it.
    if [ -f "$RUN/run.sqlite" ] && sqlite3 "$RUN/run.sqlite" "SELECT value FROM meta WHERE key = 'config'" |
        .venv/bin/python -c 'import json, sys; held = ",".join(json.load(sys.stdin)["protocols"])
sys.exit(0 if held.startswith(sys.argv[1] + ",") else 1)' "$1"; then
        echo "the run has grown past the stage $1: skipped"
        return 0
    fi
    MOOT_EMBEDDED_THREADS=${THREADS:-2} nice -n "${NICE:-15}" "$MOOT" eval -d gsm8k --seed 0 --skip 100 -n 300 --seed-stride 3 \
        -p "$1" -m embedded:qwen2.5-1.5b --max-tokens 512 -o "$RUN" -j 3 --no-report --blind
}
export -f stage
export MOOT RUN THREADS
mkdir -p runs
nohup bash -c "stage '$STAGE1' && stage '$STAGE2' && stage '$STAGE3'" > "$RUN.log" 2>&1 &
echo "started the GSM8K pre-registered run -> $RUN (log $RUN.log, pid $!)"
