#!/usr/bin/env bash
# On a lent GPU machine (the device tool): stage the wheels that benchmarks/gpu/prepare.sh cut into parts, install
# them offline on top of the machine's own JAX, and train the model there.
#
# The parts travel one device call each (64 MiB a call), named in that call's carry; the staged wheels stay in
# /tmp while the machine stays warm (30 s after a call), so the calls follow one another at once:
#
#   carry [".gpu/part-1"]:                  bash benchmarks/gpu/run.sh stage
#   carry [".gpu/part-2"]:                  bash benchmarks/gpu/run.sh stage
#   carry [".gpu/part-3", "data/raw"]:      bash benchmarks/gpu/run.sh stage install train
#
# Later calls on the same warm machine run `bash benchmarks/gpu/run.sh install train [overrides]` (install is quick
# once done: it only checks). `install` refuses to go on while a part is missing (the machine went back between
# calls) and names it. `train` runs a short GPU training of config/gpu/diffeqformer.yaml on the offline corpus
# (data/raw must travel: the machine cannot download it), and further arguments override that config.
# The gpu preset's whole pipeline, and the pack of what the book's GPU edition needs (at most 8 files of 16 MiB, no
# weights), follow `stage install` in the same call; the machine's copy of the working tree has no git, so the
# commit of the code is named (`git rev-parse HEAD` here). Back here, `python -m diffeqformer.pipeline.edition import
# <the edition folder that came back>` checks the pack and installs it into book/gpu/ (book/reproducing.md):
#
#   carry [".gpu/part-3", "data/raw"]:  bash benchmarks/gpu/run.sh stage install &&
#     export PYTHONPATH=/tmp/diffeqformer-site:$PWD/src DIFFEQFORMER_COMMIT=<sha> &&
#     python3 -m diffeqformer.pipeline --preset gpu --no-book &&
#     python3 -m diffeqformer.pipeline.edition pack --out $OUT/edition
#
# With DIFFEQFORMER_GPU_CHECK=cpu everything but the device check runs on a CPU (benchmarks/gpu/simulate.sh).
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

[ $# -gt 0 ] || { sed -n '2,32p' "$0"; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    stage) stage; shift ;;
    install) install; shift ;;
    train) shift; train "$@"; break ;;
    measure) shift; measure "$@"; break ;;
    *) echo "error: unknown step '$1' (stage, install, train, measure)" >&2; exit 1 ;;
  esac
done
