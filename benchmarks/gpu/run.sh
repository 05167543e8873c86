#!/usr/bin/env bash
# On a lent GPU machine (the device tool): stage the wheels that benchmarks/gpu/prepare.sh cut into parts, install
# them offline on top of the machine's own JAX, then train there, or run the whole gpu pipeline and pack its edition.
#
# The gpu pipeline, in one device call: `bash benchmarks/gpu/prepare.sh --for pipeline` here cuts the one part of
# 55 MiB the pipeline needs (every process of it: trainings, Papermill, notebook kernels, the pack; bundle.py's
# probe), which travels with the offline corpus (data/raw, 5 MiB) and the working tree within the call's 64 MiB:
#
#   carry [".gpu/part-1", "data/raw"]:  DIFFEQFORMER_COMMIT=<git rev-parse HEAD here>
#     bash benchmarks/gpu/run.sh stage install pipeline
#
# `pipeline` runs `python -m diffeqformer.pipeline --preset gpu --no-book` (the book is built here, from the imported
# edition; further arguments go to the pipeline), then `python -m diffeqformer.pipeline.edition pack --out
# $OUT/edition` (at most 8 files of 16 MiB, no weights). The machine's copy of the working tree has no git, so the
# commit of the code is named. Interrupted, the same call again (or `install pipeline` while the machine is warm)
# resumes: the pipeline keeps what finished. Back here, `python -m diffeqformer.pipeline.edition import <the
# edition folder that came back>` checks the pack and installs it into book/gpu/ (book/reproducing.md).
#
# A training alone (the bundle of `prepare.sh`, Levanter's trainer: one part too since bundle.py leaves out polars,
# vortex-data and wandb) trains config/gpu/diffeqformer.yaml a few steps on the offline corpus; further arguments
# override that config:
#
#   carry [".gpu/part-1", "data/raw"]:  bash benchmarks/gpu/run.sh stage install train
#
# Parts travel one device call each, named in that call's carry; the staged wheels stay in /tmp while the machine
# stays warm (30 s after a call), so a bundle of several parts takes `stage` calls one after another at once and
# `stage install ...` with the last. `install` refuses to go on while a part is missing (the machine went back
# between calls) and names it; once done it only checks. With DIFFEQFORMER_GPU_CHECK=cpu everything but the device
# check runs on a CPU (benchmarks/gpu/simulate.sh).
#
# The step-time measurements (benchmarks/gpu/measure.py) need only the one part of
# `python benchmarks/gpu/bundle.py download --for measure --also chex diffrax equinox jaxtyping lineax optax
# optimistix wadler-lindig`, so one call stages, installs and measures (arguments after `measure` are its own):
#
#   carry [".gpu/part-1"]:  bash benchmarks/gpu/run.sh stage install measure --ladder --out $OUT/ladder.json
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
  [ "$found" = 1 ] || { echo "error: no .gpu/part-* in this call's working tree: name one in carry" >&2; exit 1; }
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
    carry = ", ".join(f'".gpu/{name.split()[0]}"' for name in absent)
    sys.exit("error: not staged on this machine: " + ", ".join(absent) + ". The machine was given back between "
             f"calls or a part was not carried: stage it (again) in the next call, with carry [{carry}]: "
             "bash benchmarks/gpu/run.sh stage install ...")
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
  local edition=${DIFFEQFORMER_EDITION:-${OUT:-/tmp/diffeqformer-out}/edition}
  if [ "${DIFFEQFORMER_GPU_CHECK:-}" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  if [ -z "${DIFFEQFORMER_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
    echo "warning: no DIFFEQFORMER_COMMIT and no git here: the edition's commit will read 'unknown'" >&2
  fi
  # finished runs' checkpoints deleted (the machine's 64 GiB of disk; an interrupted run keeps its own and resumes)
  export DIFFEQFORMER_PRUNE_CHECKPOINTS=${DIFFEQFORMER_PRUNE_CHECKPOINTS:-1}
  start=$(date +%s)
  "$PYTHON" -m diffeqformer.pipeline --preset "$preset" --no-book "$@"
  echo "pipeline --preset $preset (no book) in $(( $(date +%s) - start )) s"
  "$PYTHON" -m diffeqformer.pipeline.edition pack --preset "$preset" --out "$edition"
  ls -l "$edition"
}

[ $# -gt 0 ] || { sed -n '2,35p' "$0"; exit 1; }
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
