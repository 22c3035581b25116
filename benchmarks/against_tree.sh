#!/bin/sh
# Today's benchmarks/bench_interleaved.py on another tree of moot (a commit, a tag): the server it
# starts and its in-process arms (I, E) run that tree's code, so that what the server spends now
# can be set beside what it spent then, on the same machine, in the same minutes.
#
#     sh benchmarks/against_tree.sh dd2655b --reps 3             # the tree the outside review measured
#     MOOT_ABL=redact sh benchmarks/against_tree.sh 1d5f010 --patch benchmarks/ablations.patch --arms E,S
#
# --patch FILE (right after REV): a patch applied to that tree first, such as the ablation switches of
# docs/benchmarks.md (session 39), which the environment's MOOT_ABL turns on. BENCH=bench_collector.py
# runs that benchmark instead (its options then).
#
# The tree is checked out in a temporary git worktree, removed at the end; today's benchmark files
# are copied into it (its own may be older or missing). That tree's moot must import with this
# checkout's .venv (its dependencies installed here).
set -eu
if [ $# -lt 1 ]; then
    echo "usage: sh benchmarks/against_tree.sh REV [--patch FILE] [bench_interleaved.py options]" >&2
    exit 2
fi
rev=$1
shift
here=$(pwd)
patch=""
if [ "${1:-}" = "--patch" ]; then
    [ $# -ge 2 ] && [ -f "$2" ] || { echo "against_tree.sh: --patch needs a patch file" >&2; exit 2; }
    patch=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
    shift 2
fi
git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || {
    echo "against_tree.sh: $rev is not a commit of this repository; give a commit id or tag" >&2
    exit 2
}
tmp=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$tmp/tree" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT INT TERM
git worktree add --quiet --detach "$tmp/tree" "$rev"
[ -z "$patch" ] || git -C "$tmp/tree" apply "$patch"
mkdir -p "$tmp/tree/benchmarks"
cp "$here"/benchmarks/*.py "$tmp/tree/benchmarks/"
cd "$tmp/tree"
echo "# the tree: $(git log -1 --format='%h %cs %s' | cut -c1-100)${patch:+, with $(basename "$patch")}${MOOT_ABL:+ (MOOT_ABL=$MOOT_ABL)}"
PYTHONPATH="$tmp/tree/src" "$here/.venv/bin/python" "benchmarks/${BENCH:-bench_interleaved.py}" "$@"
