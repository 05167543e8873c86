#!/usr/bin/env bash
# On a GPU machine without network that has Python 3.12 and JAX 0.11.2 for CUDA: stage the wheels that
# benchmarks/gpu/prepare.sh downloaded on a machine with network, install them offline on top of the machine's own
# JAX, then train there, or run the gpu preset's whole workflow and pack its edition. Run it in the root of the copied
# tree.
#
# The gpu workflow: on the machine with network, `bash benchmarks/gpu/prepare.sh --for pipeline` writes the wheels the
# workflow needs (every process of it: Snakemake, the token-cache, training and notebook jobs with their kernels, the
# pack; bundle.py's probe) into .gpu/part-K and the offline corpus into data/raw (5 MiB). Copy the working tree with
# both folders to the GPU machine; there:
#
#   DIFFEQFORMER_COMMIT=<git rev-parse HEAD of the copy> bash benchmarks/gpu/run.sh stage install pipeline
#
# `pipeline` runs the gpu preset's workflow without its book (Snakemake's target `notebooks`: the trainings and the
# executed notebooks; the book is built where the edition is imported), with the Snakemake of the bundle:
# `python -m snakemake -s workflow/Snakefile --cores all --rerun-incomplete --scheduler greedy notebooks --config
# preset=gpu`, further arguments after it (more Snakemake options, e.g. --keep-going or -n, or config items such as
# 'set=["f1_model.num_times=801"]'). Only when every job has succeeded does it run `python -m
# diffeqformer.workflow.edition pack --out <output folder>` (at most 8 files of 16 MiB, no weights): the output
# folder is DIFFEQFORMER_EDITION, by default _build/gpu-edition. A copied tree without git cannot tell its commit,
# so it is named. Interrupted or failed, nothing is packed, and the same command resumes: Snakemake keeps every
# finished training and notebook, runs again the jobs that were cut short (an interrupted training from its last
# checkpoint) and removes the lock a killed run left. Bring the output folder back; there `python -m
# diffeqformer.workflow.edition import <output folder>` checks the pack and installs it into book/gpu/
# (book/reproducing.md).
#
# A training alone (the bundle of `prepare.sh` without arguments) trains config/gpu/diffeqformer.yaml a few steps on
# the offline corpus; further arguments override that config:
#
#   bash benchmarks/gpu/run.sh stage install train
#
# A bundle comes in parts of at most 56 MiB (.gpu/part-K), for transfers with a size limit; most are one part.
# `stage` copies the parts found in .gpu/ into the wheel folder (DIFFEQFORMER_WHEELS, default /tmp/diffeqformer-wheels),
# so parts copied one at a time can be staged one at a time; `install` refuses to go on while a part is missing, and
# names it. Once installed (DIFFEQFORMER_SITE, default /tmp/diffeqformer-site) it only checks. With
# DIFFEQFORMER_GPU_CHECK=cpu everything but the GPU check runs on a CPU (benchmarks/gpu/simulate.sh).
#
# The step-time measurements (benchmarks/gpu/measure.py) need only the one part of
# `python benchmarks/gpu/bundle.py download --for measure --also chex diffrax equinox jaxtyping lineax optax
# optimistix wadler-lindig` (arguments after `measure` are its own):
#
#   bash benchmarks/gpu/run.sh stage install measure --ladder --out benchmarks/results/ladder.json
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${DIFFEQFORMER_WHEELS:-/tmp/diffeqformer-wheels}
SITE=${DIFFEQFORMER_SITE:-/tmp/diffeqformer-site}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

stage() {
  mkdir -p "$WHEELS"
  local found=0
  for part in .gpu/part-*; do
    [ -d "$part" ] || continue
    cp "$part"/*.whl "$WHEELS"/ && cp "$part/manifest.json" "$WHEELS/manifest.json"
    echo "staged $part: $(ls "$part"/*.whl | wc -l) wheels"
    found=1
  done
  [ "$found" = 1 ] || {
    echo "error: no .gpu/part-* in this working tree: copy the parts benchmarks/gpu/prepare.sh wrote" >&2; exit 1; }
}

install() {
  [ -f "$WHEELS/manifest.json" ] || { echo "error: nothing staged in $WHEELS: stage the parts first" >&2; exit 1; }
  "$PYTHON" - "$WHEELS" <<'EOF'
import json, pathlib, sys
wheels = pathlib.Path(sys.argv[1])
parts = json.loads((wheels / "manifest.json").read_text())["parts"]
absent = [f"part-{k} ({sum(not (wheels / w).exists() for w in part)} of {len(part)} wheels)"
          for k, part in enumerate(parts, 1) if not all((wheels / w).exists() for w in part)]
if absent:
    copy = ", ".join(f".gpu/{name.split()[0]}" for name in absent)
    sys.exit("error: not staged on this machine: " + ", ".join(absent) + f". Copy {copy} into this working tree, "
             "then: bash benchmarks/gpu/run.sh stage install ...")
EOF
  if [ ! -f "$SITE/.installed" ] || ! cmp -s "$WHEELS/manifest.json" "$SITE/.installed"; then
    rm -rf "$SITE"
    start=$(date +%s)
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
    cp "$WHEELS/manifest.json" "$SITE/.installed"
    echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE in $(( $(date +%s) - start )) s"
  fi
  "$PYTHON" benchmarks/gpu/bundle.py verify "$SITE"
  "$PYTHON" -c 'import jax, levanter, haliax, diffeqformer; print("jax", jax.__version__, "on", jax.devices())'
}

train() {
  local run_dir=${DIFFEQFORMER_GPU_RUN:-/tmp/diffeqformer-gpu-run}
  local accelerator=true
  if [ "${DIFFEQFORMER_GPU_CHECK:-}" = cpu ]; then
    accelerator=false
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  rm -rf "$run_dir"
  start=$(date +%s)
  "$PYTHON" -m diffeqformer.train --config config/gpu/diffeqformer.yaml --run_dir "$run_dir" \
    --data.dataset shakespeare --trainer.num_train_steps 100 --trainer.steps_per_eval 100 \
    --trainer.max_eval_batches 10 --trainer.require_accelerator "$accelerator" "$@"
  echo "trained in $(( $(date +%s) - start )) s (start-up, data preparation and compilation included):"
  cat "$run_dir/complete.json"
}

measure() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu/measure.py "$@"
}

pipeline() {
  local preset=${DIFFEQFORMER_PRESET:-gpu}
  local edition=${DIFFEQFORMER_EDITION:-_build/gpu-edition}
  if [ "${DIFFEQFORMER_GPU_CHECK:-}" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  if [ -z "${DIFFEQFORMER_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
    echo "warning: no DIFFEQFORMER_COMMIT and no git here: the edition's commit will read 'unknown'" >&2
  fi
  "$PYTHON" -c 'import snakemake' 2>/dev/null || {
    echo "error: no Snakemake on this Python: install the workflow's bundle (bash benchmarks/gpu/prepare.sh --for" \
      "pipeline, on a machine with network), not a training's" >&2; exit 1; }
  # One run.sh workflow at a time in this tree: a lock on file descriptor 9 (Snakemake inherits it), released when
  # this shell and Snakemake have ended, however they ended. Holding it, a lock that Snakemake left in
  # .snakemake/locks (Snakemake killed by SIGKILL, the machine lost) is a dead run's and is removed.
  mkdir -p _build/workflow
  exec 9>_build/workflow/run-sh.lock
  if ! "$PYTHON" -c 'import fcntl; fcntl.flock(9, fcntl.LOCK_EX | fcntl.LOCK_NB)' 2>/dev/null; then
    echo "error: another workflow of benchmarks/gpu/run.sh is still running in this tree (it holds" \
      "_build/workflow/run-sh.lock): let it finish, or end it, then run this command again" >&2
    exit 1
  fi
  if [ -n "$(ls -A .snakemake/locks 2>/dev/null)" ]; then
    echo "removing the lock that an interrupted workflow left in .snakemake/locks"
    "$PYTHON" -m snakemake -s workflow/Snakefile --unlock --config preset="$preset"
  fi
  # finished runs' checkpoints deleted (about 80 GB otherwise; an interrupted run keeps its own and resumes)
  export DIFFEQFORMER_PRUNE_CHECKPOINTS=${DIFFEQFORMER_PRUNE_CHECKPOINTS:-1}
  start=$(date +%s)
  rc=0
  # the bundle's Snakemake, on this Python (its jobs too); greedy: its ILP scheduler's solver is not bundled (bundle.py)
  "$PYTHON" -m snakemake -s workflow/Snakefile --cores all --rerun-incomplete --scheduler greedy notebooks \
    --config preset="$preset" "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "error: the $preset workflow stopped (exit $rc) after $(( $(date +%s) - start )) s; nothing packed." \
      "Each job's log: _build/workflow/$preset/logs/. Run the same command again to resume: the trainings and" \
      "notebooks that finished are kept." >&2
    exit "$rc"
  fi
  echo "the $preset workflow (no book) in $(( $(date +%s) - start )) s"
  "$PYTHON" -m diffeqformer.workflow.edition pack --preset "$preset" --out "$edition"
  ls -l "$edition"
}

[ $# -gt 0 ] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    stage) stage; shift ;;
    install) install; shift ;;
    train) shift; train "$@"; break ;;
    measure) shift; measure "$@"; break ;;
    pipeline) shift; pipeline "$@"; break ;;
    *) echo "error: unknown step '$1' (stage, install, train, measure, pipeline)" >&2; exit 1 ;;
  esac
done
