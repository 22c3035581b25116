#!/usr/bin/env bash
# The evidence runs of issue 31: `moot tune` on Qwen2.5-Coder-1.5B-Instruct for ARC-Challenge and
# CommonsenseQA. The tuning items are the committed 1.5B runs' 200 (their request caches answer every
# tuning call); the 200 held-out items are the next 200 of the same seeded order, which no run has
# touched, so only the choice and the vote at its budget cost calls there. Re-running resumes.
#   bash tools/tune_runs.sh arc            # one tune in the background (one llama.cpp thread); csqa likewise
#   THREADS=2 bash tools/tune_runs.sh csqa # two threads: when it runs alone on the 2 cores
#   bash tools/tune_runs.sh publish arc    # a finished tune's tune.md, tune.json, tuned.yaml and its two
#                                          # stores (without the imported cache) into docs/results/tune/
set -euo pipefail
cd "$(dirname "$0")/.."
MOOT=${MOOT:-.venv/bin/moot}
CANDIDATES="single,direct,vote@3,vote@6,vote@8,cisc(k=8),adaptive-consistency(threshold=0.8),\
adaptive-consistency(threshold=0.9),adaptive-consistency(threshold=0.95),\
weighted-vote(signal=answer_prob,softmax_t=0.2),weighted-vote(signal=seq_prob,softmax_t=0.2),filtered-vote(keep=0.5)"
OUT=docs/results/tune
dataset() {  # name -> dataset, committed store
    case "$1" in
        arc) echo "arc-challenge arc-challenge-1.5b" ;;
        csqa) echo "commonsenseqa commonsenseqa-1.5b" ;;
    esac
}
check_names() {  # every name known, before anything starts
    for name in "$@"; do
        case "$name" in arc|csqa) ;; *) echo "error: no tune named $name: arc or csqa" >&2; exit 2 ;; esac
    done
}
running() {  # the pid of the tune writing runs/tune-<name>, if one is, however it was started
    local part pid
    for part in tuning holdout; do  # the pid a part's writer left in its lock, if it still runs a tune
        pid=$(cat "runs/tune-$1/$part/run.lock" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -qa "tune-$1" "/proc/$pid/cmdline" 2>/dev/null; then
            echo "$pid"
            return
        fi
    done
    pgrep -f "moot tune .*--out runs/tune-$1( |$)" || true  # between the two parts, as this script starts it
}
if [ "${1:-}" = publish ]; then
    shift
    [ $# -gt 0 ] || { echo "error: publish which tune? arc or csqa" >&2; exit 2; }
    check_names "$@"
    for name in "$@"; do
        read -r data store <<< "$(dataset "$name")"
        folder=runs/tune-$name
        [ -f "$folder/tuned.yaml" ] || { echo "error: $folder has no tuned.yaml: the tune has not finished" >&2; exit 2; }
        pid=$(running "$name")
        [ -z "$pid" ] || { echo "error: $folder is still being written (pid $pid): publish it once it has finished" >&2; exit 2; }
        mkdir -p "$OUT/$data"
        cp "$folder"/tune.md "$folder"/tune.json "$folder"/tuned.yaml "$OUT/$data/"
        .venv/bin/python tools/snapshot_run.py "$folder/tuning" "$OUT/$data/tuning.sqlite.gz" \
            --minus "docs/results/$store/run.sqlite.gz"
        .venv/bin/python tools/snapshot_run.py "$folder/holdout" "$OUT/$data/holdout.sqlite.gz"
    done
    exit 0
fi
[ $# -gt 0 ] || { echo "error: which tune? bash tools/tune_runs.sh arc (or csqa, or publish NAME)" >&2; exit 2; }
check_names "$@"
for name in "$@"; do
    read -r data store <<< "$(dataset "$name")"
    pid=$(running "$name")
    [ -z "$pid" ] || { echo "runs/tune-$name is already running (pid $pid)"; continue; }
    mkdir -p runs
    MOOT_EMBEDDED_THREADS=${THREADS:-1} nohup "$MOOT" tune --dataset "$data" --seed 0 --tuning-n 200 --holdout-n 200 \
        -m embedded:qwen2.5-1.5b --max-tokens 256 --cache-from "docs/results/$store" --out "runs/tune-$name" \
        --candidates "$CANDIDATES" > "runs/tune-$name.log" 2>&1 &
    echo "started the $data tune -> runs/tune-$name (log runs/tune-$name.log, pid $!)"
done
