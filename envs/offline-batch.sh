#!/usr/bin/env bash
# Run a list of record targets on an offline GPU node within a time limit, one Snakemake
# invocation per target, so that a call that must end by a deadline (a lent machine's
# 10-minute call, a Slurm allocation's last minutes) never starts a cell it cannot finish:
# a cell killed half-way is GPU time spent on nothing. Before each target it checks that
# the time left is at least 1.2 times the longest cell so far (or FIRST_S before any has run);
# a target it cannot hold is not started, and the list goes on with the next ones (a shorter
# cell, or a search, may still fit the time left; the list's order is its priority); a
# max-batch search needs FIRST_S only, as it starts no probe that its job's deadline cannot
# hold (below). After each target it prints one line: the target, its status,
# tokens/s and the seconds the invocation took, so the log is the batch's table.
#
#   bash envs/offline-batch.sh .whl 540 todo.txt --configfile config/recipes/one-gpu-sweep.yaml \
#       --cores 16 --resources gpu_slots=1
#
# todo.txt holds one record target per line, e.g. from
#   python -m llmbench.report.coverage targets COVERAGE_CSV CONFIG --platform h100
# A target already recorded in the results folder is skipped (its line says so; Snakemake
# is not run for it, so a record is never replaced), so the same list can be given to the
# next call. A target may be a max-batch search's folder (results/runs/search/...,
# from `coverage targets ... --to-do "search the largest batch"`): once the search has
# found its batch, the cell it measures there runs next (python -m llmbench.offline
# measured-target), under the same deadline. Exit status: 0 when every target ran or
# was recorded before (whatever its record's status), 3 when the deadline left targets
# unstarted, 2 when SKIP_RECORDED could not be read, else Snakemake's. OFFLINE_RUN names
# the script that runs one target (default envs/offline-run.sh;
# tests/integration/test_offline_batch.py gives a stand-in). A cell longer than a call: give the list again, call after call; its
# finished repeats carry over (llmbench.ledger). A target still running
# at the deadline is stopped there (exit status 3): a max-batch search's probes are not
# bounded by the longest cell so far. Snakemake marks a stopped target incomplete, so each
# target runs with --rerun-incomplete, after the batch has removed stale locks (snakemake
# --unlock; a stopped Snakemake leaves its lock): the next call resumes it (a search from its frontier
# file, which also puts back the records of the probes it ran; a cell from its repeats).
# Each target's job is also given the deadline, less DEADLINE_SLACK_S (default 15 s), as
# LLMBENCH_DEADLINE (llmbench.ledger): a cell does not start a repeat, nor a search a probe,
# that would not finish by it (1.2 times the longest so far), so a cell of several repeats
# stops between two, its finished ones kept, instead of being killed inside one; the line
# says so (exit status 3), and the list goes on: a later target the time left holds still
# runs (a shorter cell, or what is left of one that an earlier call began).
# A measured cell can run out of memory where its search's probe fit (it runs more steps, and
# the allocator's fragmentation can grow past what the probe showed): its record says oom,
# and the cell at the next batch down whose probe fit runs next (llmbench.search.measured_batch).
# A cell that a max-batch search probed at its batch starts only if the time left holds 1.25
# times the probe's estimate of a repeat plus 20 s (python -m llmbench.offline estimate: the
# probe's set-up plus its seconds a step times the cell's steps, the protocol read from the
# last --configfile; how the committed cells' wall times compare with it:
# docs/offline-gpu-nodes.md); one repeat, as a cell stops between repeats at its job's
# deadline (below). Without a probe, ESTIMATE_FROM="DIR ..." (optional: results folders, e.g. the reference runs)
# gives the same estimate from the cell's own record there with the most measured steps
# (a sweep's 3 + 10 steps time a protocol rerun's 30 + 100): the cell starts only if the
# time left holds 1.2 times that repeat plus 20 s (a cell of one repeat longer than a call is never
# started, rather than killed at the deadline every call; its line says that no call of
# DEADLINE_S starts it, and `python -m llmbench.offline plan LIST CONFIG --call-s DEADLINE_S`
# names such cells before any call). A cell whose repeat the deadline stopped inside (an
# estimate that fell short) left how long that repeat ran (llmbench.ledger.STOPPED); where
# that is longer, it is the estimate, and the cell starts only with 1.2 times it plus 20 s
# left (the cell's own deadline check wants the 1.2). A cell resumed with the repeats an
# earlier run kept beside its record (stopped between repeats) is timed by the longest of
# them, with the same 1.2 plus 20 s, and only its other repeats count. A probe's or a record's
# estimate is given to the cell's job too (LLMBENCH_REPEAT_S, llmbench.ledger): its own
# deadline check judges the first repeat it has not timed by 1.2 times it, the check made here,
# rather than by the throughput model's prediction (1.5 times it), which could stop at once a
# cell started here. The line after a cell gives the estimate of all the repeats it ran
# beside the seconds it took.
# SKIP_RECORDED="DIR ..." (optional): results folders (a reference run's, holding runs/...)
# whose records count as done: a target recorded in one of them is skipped (a search folder
# once its search.json and the cell it measures are there), so the same list can go to a
# fresh machine after its records were committed. A search folder one of them holds without
# the cell it measures (never measured, or measured at a batch that then ran out of memory)
# becomes that cell's target alone: the search is not run again (python -m llmbench.offline
# recorded-in, with the wheels installed first; where it fails the batch stops, exit 2).
# SEED_FRONTIER="DIR ..." (optional): before the first target, the frontier files are rebuilt
# from the probe records under each DIR (python -m llmbench.search seed-frontier), so that a
# search whose cells a committed reference run already probed (same platform file, same
# spec) starts from those outcomes on a fresh machine; a DIR holding a stopped search's
# frontier with its kept probes (<technique>-g<gpus>.probes/, saved before the machine went
# back) gives the resumed search those probes' own records and logs. The wheels are
# installed first (offline-run.sh --install-only), for llmbench's yaml and jsonschema.
set -uo pipefail
cd "$(dirname "$0")/.."
whl=${1:?usage: offline-batch.sh WHEELHOUSE DEADLINE_S TARGETS_FILE [snakemake arguments]}
deadline=${2:?usage: offline-batch.sh WHEELHOUSE DEADLINE_S TARGETS_FILE [snakemake arguments]}
list=${3:?usage: offline-batch.sh WHEELHOUSE DEADLINE_S TARGETS_FILE [snakemake arguments]}
shift 3
start=$SECONDS
first=${FIRST_S:-60}
longest=$first
site_path=workflow/scripts:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# DeepSpeed's ops are built ahead (below) on a GPU machine unless BUILD_OPS=0
build_ops=""
[[ ${BUILD_OPS:-1} != 0 ]] && nvidia-smi -L > /dev/null 2>&1 && build_ops=1
# llmbench.search (seed-frontier) and llmbench.offline (recorded-in) read yaml and
# jsonschema, the op build DeepSpeed: the wheels first
if [[ -n ${SEED_FRONTIER:-}${SKIP_RECORDED:-}$build_ops ]]; then
    bash "${OFFLINE_RUN:-envs/offline-run.sh}" "$whl" --install-only
fi
if [[ -n ${SEED_FRONTIER:-} ]]; then
    for d in $SEED_FRONTIER; do
        PYTHONPATH=$site_path python3 -m llmbench.search seed-frontier "$d" | sed 's/^/offline-batch: seed: /'
    done
fi
# DeepSpeed's JIT ops are built here, on a GPU machine, before the first target (BUILD_OPS=0:
# not), for each platform of the list's DeepSpeed targets, in its environment: a fresh
# machine otherwise compiles them inside its first cells, whose repeats then run past their
# estimates (llmbench.train.jit_ops). Its seconds count against the deadline; its output is
# kept in OPS_LOG (default results/logs/offline-batch/jit-ops-<list>.log), and where it fails
# its last line is said and the batch goes on: the first cells build them as before.
if [[ -n $build_ops ]]; then
    ops_log=${OPS_LOG:-results/logs/offline-batch/jit-ops-$(basename "$list" .txt).log}
    mkdir -p "$(dirname "$ops_log")"
    if PYTHONPATH=$site_path python3 -m llmbench.train.jit_ops build --targets "$list" > "$ops_log" 2>&1; then
        grep '^llmbench: DeepSpeed op' "$ops_log" | sed 's/^llmbench: /offline-batch: /'
    else
        why=$(grep -v '^[[:space:]]*$' "$ops_log" | tail -1 | cut -c1-200)
        echo "offline-batch: DeepSpeed's ops not built ahead ($why; $ops_log); the first cells build them"
    fi
fi
# a target a deadline stopped (here or in an earlier call on the same machine) can leave
# Snakemake's lock on its outputs, and every later run of it would stop at LockException:
# the batch runs one Snakemake at a time, so it removes stale locks before it starts
bash "${OFFLINE_RUN:-envs/offline-run.sh}" "$whl" --unlock "$@" > /dev/null 2>&1 || true
rc=0
mapfile -t targets < <(grep -v '^\s*\(#\|$\)' "$list")
# SKIP_RECORDED: "skip DIR" where the results folder DIR (DIR/runs/...) holds target
# results/runs/... (a search folder once the cell it measures is there too); else "cell
# TARGET" where one holds the search but not that cell (TARGET: the cell's path beside the
# given one); status 1 where none holds it, 2 where it cannot tell (python -m
# llmbench.offline recorded-in failed: its error is on stderr)
recorded_in() {
    [[ -n ${SKIP_RECORDED:-} ]] || return 1
    local found
    # shellcheck disable=SC2086  # SKIP_RECORDED is a list of folders
    found=$(PYTHONPATH=$site_path python3 -m llmbench.offline recorded-in "$1" $SKIP_RECORDED) || return 2
    [[ $found == none ]] && return 1
    echo "$found"
}
# the config the targets' cells come from (the estimates read their protocol there): the
# last --configfile, else the embedded default
configfile=config/config.yaml
prev=""
for a in "$@"; do
    [[ $prev == --configfile ]] && configfile=$a
    [[ $a == --configfile=* ]] && configfile=${a#--configfile=}
    prev=$a
done
# a cell's line: TARGET, its status, tokens/s (mean ± std over its repeats), WHAT (the
# seconds it took, or why it did not run) and its reason
record_line() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
target, what = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(target))
except (OSError, ValueError) as e:
    print(f"offline-batch: {target}  no record ({e.__class__.__name__})  {what}")
    sys.exit()
m = r.get("metrics") or {}
tps = m.get("tokens_per_s_mean")
std = m.get("tokens_per_s_std") if len(m.get("tokens_per_s_runs") or []) > 1 else None
rate = (f"{tps:.1f} tok/s" + (f" ± {std:.1f}" if std is not None else "")) if tps else "-"
print(f"offline-batch: {target}  {r.get('status')}  {rate}  {what}  {(r.get('reason') or '')[:120]}")
EOF
}
# the search folder a measured cell came from (asked again when the cell runs out of memory)
declare -A searched_by=()
# a target's output, read for the line its job exits with when it stops at its deadline
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# seconds between a job's deadline and the batch's: Snakemake's own start and end
DEADLINE_SLACK_S=${DEADLINE_SLACK_S:-15}
i=0
while (( i < ${#targets[@]} )); do
    t=${targets[i]}
    i=$((i + 1))
    found=$(recorded_in "$t")
    frc=$?
    if (( frc == 2 )); then
        echo "offline-batch: $t  cannot tell whether SKIP_RECORDED holds it (above): the batch stops here"
        rc=2
        break
    fi
    if (( frc == 0 )); then
        if [[ $found == "skip "* ]]; then
            echo "offline-batch: $t  already recorded in ${found#skip }: skipped"
        else
            echo "offline-batch: $t  searched in SKIP_RECORDED, its cell not measured: ${found#cell } next"
            targets=("${targets[@]:0:i}" "${found#cell }" "${targets[@]:i}")
        fi
        continue
    fi
    # a cell recorded here already (an earlier call's, or an earlier line of this list): its
    # line, and no Snakemake run nor deadline check (a check could hold back a target with
    # nothing to run, and end the batch as if one were left); a record is never replaced
    if [[ $t == *.json && -f $t ]]; then
        record_line "$t" "recorded before: skipped"
        continue
    fi
    left=$((deadline - (SECONDS - start)))
    est="" reps="" src=""
    # est: a repeat's seconds; need: the seconds left it wants (llmbench.offline's Estimate.start_s)
    [[ $t == *.json ]] && read -r est reps need src < <(PYTHONPATH=$site_path python3 -m llmbench.offline estimate \
        "$t" "$configfile" ${ESTIMATE_FROM:+--earlier $ESTIMATE_FROM} 2>/dev/null)
    # a probe's or an earlier record's repeat goes to the job (LLMBENCH_REPEAT_S), whose own
    # deadline check then judges the cell's first repeat by it, not by the throughput model
    given=""
    [[ $est =~ ^[0-9]+$ && ($src == probe || $src == */runs/*) ]] && given=$est
    if [[ $est =~ ^[0-9]+$ && $src == probe ]]; then
        why="its search's probe puts a repeat at ${est}s (x 1.25 + 20 s: ${need}s)"
    elif [[ $est =~ ^[0-9]+$ && $src == stopped ]]; then
        why="a repeat of it was stopped unfinished after ${est}s (x 1.2 + 20 s: ${need}s)"
    elif [[ $est =~ ^[0-9]+$ && $src == predicted ]]; then
        why="the throughput model predicts a repeat at ${est}s (x 1.5 + 20 s: ${need}s)"
    elif [[ $est =~ ^[0-9]+$ && $src == kept ]]; then
        why="the longest repeat it kept took ${est}s (x 1.2 + 20 s: ${need}s)"
    elif [[ $est =~ ^[0-9]+$ ]]; then
        why="its record in ${src%%/runs/*} puts a repeat at ${est}s (x 1.2 + 20 s: ${need}s)"
    elif [[ $t != *.json ]]; then  # a search stops between probes at its job's deadline
        est="" need=$first why="a search needs FIRST_S (${first}s) for its first probe"
    else
        # 1.2 times it, rounded up, as the cell's own deadline check wants (llmbench.ledger)
        est="" need=$(( (longest * 6 + 4) / 5 )) why="the longest cell took ${longest}s (x 1.2: ${need}s)"
    fi
    # the line after the cell gives the whole cell's: its repeats still to run (those kept count as run)
    [[ $est =~ ^[0-9]+$ ]] && est=$((est * reps))
    if (( left < need )); then
        next="the next call runs it"
        # a repeat longer than a whole call: calls of this length never start it
        [[ $est =~ ^[0-9]+$ ]] && (( need > deadline )) && next="no call of ${deadline}s starts it: a longer one must"
        echo "offline-batch: ${left}s left, $why: not starting $t (later targets go on; $next)"
        rc=3
        continue
    fi
    t0=$SECONDS
    # the deadline also bounds the target itself: a search's probes or a cell longer than
    # every cell before it are stopped (TERM to the whole process group, KILL 30 s later),
    # so the batch's own lines, and whatever copies its results off afterwards, still run
    # and it is the job's own deadline (LLMBENCH_DEADLINE, llmbench.ledger): a repeat or a
    # probe that would not finish by it is not started, the job stops between them instead
    trc=0
    LLMBENCH_DEADLINE=$(( $(date +%s) + left - DEADLINE_SLACK_S )) LLMBENCH_REPEAT_S=$given \
        timeout -k 30 "$left" bash "${OFFLINE_RUN:-envs/offline-run.sh}" "$whl" "$t" --rerun-incomplete "$@" \
        2>&1 | tee "$out"
    trc=${PIPESTATUS[0]}
    took=$((SECONDS - t0))
    if (( trc == 124 || trc == 137 )); then
        echo "offline-batch: $t  stopped at the deadline after ${took}s (a search resumes from its" \
             "frontier, a cell from its finished repeats)"
        rc=3
        break
    fi
    # a job that stopped between repeats (or probes) at its deadline: the time left did not hold
    # its next one, but may hold a later target's (each is weighed as before, and its own job
    # checks its repeats against the same deadline)
    if (( trc != 0 )) && stop=$(grep -m1 -o "llmbench: stopped at the deadline: .*" "$out"); then
        echo "offline-batch: $t  ${stop#llmbench: stopped at the deadline: "$t": }  after ${took}s"
        rc=3
        continue
    fi
    (( trc != 0 )) && rc=$trc
    [[ $t == *.json ]] && (( took > longest )) && longest=$took  # cells only: a search guards itself
    if [[ $t != *.json ]]; then  # a search folder: its line, then the cell it measures
        python3 - "$t" "$took" "$est" <<'EOF'
import json, sys
target, took, est = sys.argv[1], sys.argv[2], sys.argv[3]
took = f"{took}s (estimated {est}s)" if est else f"{took}s"
try:
    s = json.load(open(f"{target}/search.json"))
except (OSError, ValueError) as e:
    print(f"offline-batch: {target}  no search.json ({e.__class__.__name__})  {took}")
    sys.exit()
print(f"offline-batch: {target}  search {s.get('status')}: largest batch {s.get('largest_ok')} in "
      f"{s.get('n_probes')} probes  {took}  {(s.get('reason') or '')[:120]}")
EOF
        # llmbench.offline needs yaml and jsonschema: from the wheels offline-run.sh installed in /tmp/site
        if measured=$(PYTHONPATH=$site_path python3 -m llmbench.offline measured-target "$t" 2>&1); then
            if [[ -n $measured ]]; then
                targets=("${targets[@]:0:i}" "$measured" "${targets[@]:i}")
                searched_by[$measured]=$t
            fi
        else
            echo "offline-batch: $t  no measured cell: ${measured:0:200}"
        fi
        continue
    fi
    what="${took}s"
    [[ -n $est ]] && what="$what (estimated ${est}s)"
    record_line "$t" "$what"
    # a measured cell that ran out of memory where its probe fit: the next batch down
    folder=${searched_by[$t]:-}
    if [[ -n $folder ]] && python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "oom")' \
            "$t" 2>/dev/null && \
            measured=$(PYTHONPATH=$site_path python3 -m llmbench.offline measured-target "$folder" 2>&1) && \
            [[ -n $measured && $measured != "$t" ]]; then
        echo "offline-batch: $t  ran out of memory where its search's probe fit: $measured next"
        targets=("${targets[@]:0:i}" "$measured" "${targets[@]:i}")
        searched_by[$measured]=$folder
    fi
done
exit $rc
