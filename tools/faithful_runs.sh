#!/usr/bin/env bash
# The faithful-debate runs of issue 27: ARC-Challenge and CommonsenseQA, 200 items each, the same
# items as the first results, on Qwen2.5-Coder-1.5B-Instruct. Round 1 and the votes' samples come
# from the committed runs' request caches (--cache-from), so only the debates' later rounds and the
# extra samples of the token-matched vote cost calls. Re-running this script resumes both runs.
#   bash tools/faithful_runs.sh            # both runs, one llama.cpp thread each, in the background
#   N=100 bash tools/faithful_runs.sh      # another n: a run grows to a larger n, never shrinks (the
#                                          # committed snapshots hold n=200, the default)
#   bash tools/faithful_runs.sh arc-faithful   # one of the two only (csqa-faithful likewise)
#   bash tools/faithful_runs.sh seeds      # the seed sets: Society of Minds and its votes on two more
#                                          # draws of round 1 (CommonsenseQA, 100 items; after the above)
#   bash tools/faithful_runs.sh snapshot   # what they finished, gzipped into docs/results/faithful/ (to
#                                          # commit); a machine without runs/ restores from there
#   bash tools/faithful_runs.sh snapshot csqa-seeds   # only the runs named
#   bash tools/faithful_runs.sh publish csqa-seeds    # a stopped run's report regenerated and copied
#                                          # into docs/results/faithful/<run>/, then its snapshot (the
#                                          # two must match: tests/test_committed_results.py)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200}
MOOT=${MOOT:-.venv/bin/moot}
# Every debate gets its vote at equal tokens (the votes at equal calls come from the cisc(k=8) pool
# when they are 8 samples or fewer); the votes run once every debate has finished all N items.
DEBATES="society-of-minds adaptive-debate mad-conformist free-mad society-of-minds(exchange=answer) \
society-of-minds(exchange=answer,history=prompt)"
PROTOCOLS="single,direct,vote@3,vote@6,cisc(k=8),${DEBATES// /,},vote@auto,vote@auto(by=tokens)"
for d in ${DEBATES#society-of-minds }; do PROTOCOLS="$PROTOCOLS,vote@auto(by=tokens,ref=$d)"; done
mkdir -p runs
SNAPSHOTS=docs/results/faithful
restore() {  # run folder: from its committed snapshot when this machine has no copy of it
    if [ ! -f "runs/$1/run.sqlite" ] && [ -f "$SNAPSHOTS/$1.sqlite.gz" ]; then
        mkdir -p "runs/$1" && gunzip -c "$SNAPSHOTS/$1.sqlite.gz" > "runs/$1/run.sqlite"
        echo "restored runs/$1 from $SNAPSHOTS/$1.sqlite.gz"
    fi
}
if [ "${1:-}" = publish ]; then  # a stopped run's report into docs/results/faithful/<run>/, then its snapshot
    shift
    [ $# -gt 0 ] || { echo "error: publish which run? arc-faithful, csqa-faithful or csqa-seeds" >&2; exit 2; }
    for name in "$@"; do
        case "$name" in arc-faithful|csqa-faithful|csqa-seeds) ;;
            *) echo "error: no run named $name: publish arc-faithful, csqa-faithful or csqa-seeds" >&2; exit 2 ;;
        esac
        [ -f "runs/$name/run.sqlite" ] || { echo "error: runs/$name/run.sqlite does not exist" >&2; exit 2; }
        # The report and the snapshot must read the same store: not one that is still growing.
        pid=$(cat "runs/$name/run.lock" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -qa "runs/$name" "/proc/$pid/cmdline" 2>/dev/null; then
            echo "error: runs/$name is still running (pid $pid): publish it once it has finished, or stop it" \
                "(kill $pid) and run this script again to resume it afterwards" >&2
            exit 2
        fi
    done
    for name in "$@"; do
        "$MOOT" eval report "runs/$name"
        mkdir -p "$SNAPSHOTS/$name"
        cp "runs/$name"/report.{md,json,html} "$SNAPSHOTS/$name/"
        if [ -d "runs/$name/plots" ]; then  # none without matplotlib: the committed ones are kept
            rm -rf "$SNAPSHOTS/$name/plots" && cp -r "runs/$name/plots" "$SNAPSHOTS/$name/"
        fi
    done
    exec bash tools/faithful_runs.sh snapshot "$@"  # the cwd is the repository's root (cd above)
fi
if [ "${1:-}" = snapshot ]; then  # what the runs finished, to commit (without the imported cache)
    shift
    for name in "$@"; do
        case "$name" in arc-faithful|csqa-faithful|csqa-seeds) ;;
            *) echo "error: no run named $name: snapshot arc-faithful, csqa-faithful or csqa-seeds" >&2; exit 2 ;;
        esac
    done
    for pair in arc-faithful:arc-challenge-1.5b csqa-faithful:commonsenseqa-1.5b csqa-seeds:commonsenseqa-1.5b; do
        folder=${pair%%:*}; store=${pair#*:}
        [ -f "runs/$folder/run.sqlite" ] || continue
        # Only the runs named, when some are (snapshot csqa-seeds).
        [ $# -eq 0 ] || [[ " $* " == *" $folder "* ]] || continue
        minus=(--minus "docs/results/$store/run.sqlite.gz")
        # The seed sets also read the main CommonsenseQA run's cache: its committed snapshot has those.
        [ "$folder" != csqa-seeds ] || minus+=(--minus "$SNAPSHOTS/csqa-faithful.sqlite.gz")
        .venv/bin/python tools/snapshot_run.py "runs/$folder" "$SNAPSHOTS/$folder.sqlite.gz" "${minus[@]}"
    done
    exit 0
fi
run() {  # dataset, run folder, committed store
    restore "$2"
    MOOT_EMBEDDED_THREADS=1 nohup "$MOOT" eval -d "$1" -n "$N" --seed 0 -p "$PROTOCOLS" \
        -m embedded:qwen2.5-1.5b --max-tokens 256 -o "runs/$2" -j 3 --no-report \
        --cache-from "docs/results/$3" > "runs/$2.log" 2>&1 &
    echo "started $1 -> runs/$2 (log runs/$2.log, pid $!)"
}
if [ "${1:-}" = seeds ]; then
    restore csqa-seeds
    restore csqa-faithful  # its cache is read (--cache-from)
    # Seed set 1's round 1 is the main run's (its cache); its round 2 is the main run's only where that run
    # had finished it when this one ran (items 1-80); sets 4 and 7 draw round 1 from seeds 4-6 and 7-9.
    SEEDS=""
    for s in 1 4 7; do
        SEEDS="$SEEDS,society-of-minds(first_seed=$s),vote@3(first_seed=$s),vote@6(first_seed=$s)"
        SEEDS="$SEEDS,vote@auto(by=tokens,ref=society-of-minds(first_seed=$s),first_seed=$s)"
    done
    MOOT_EMBEDDED_THREADS=1 nohup "$MOOT" eval -d commonsenseqa -n "${N_SEEDS:-100}" --seed 0 -p "single${SEEDS}" \
        -m embedded:qwen2.5-1.5b --max-tokens 256 -o runs/csqa-seeds -j 3 --no-report \
        --cache-from docs/results/commonsenseqa-1.5b --cache-from runs/csqa-faithful > runs/csqa-seeds.log 2>&1 &
    echo "started the seed sets -> runs/csqa-seeds (log runs/csqa-seeds.log, pid $!)"
    exit 0
fi
case "${1:-both}" in  # one run only, to leave the other core to the seed sets
    arc-faithful) run arc-challenge arc-faithful arc-challenge-1.5b ;;
    csqa-faithful) run commonsenseqa csqa-faithful commonsenseqa-1.5b ;;
    both) run arc-challenge arc-faithful arc-challenge-1.5b
          run commonsenseqa csqa-faithful commonsenseqa-1.5b ;;
    *) echo "error: no run named $1: run arc-faithful, csqa-faithful, seeds or snapshot (or nothing for both)" >&2
       exit 2 ;;
esac
