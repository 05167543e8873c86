#!/usr/bin/env bash
# Check benchmarks/gpu/prepare.sh and run.sh without a GPU: a fresh Python 3.12 venv stands in for the GPU machine
# without network, holding only packages it has (those of preinstalled-packages.txt that the bundle's probe saw
# imported; CPU jaxlib in place of its CUDA one), and each part arrives in a fresh copy of the working tree (its
# tracked and untracked-not-ignored files, as git would give them) with that part (and, with the last, data/raw).
# The last copy installs the bundle offline (--no-index --no-deps) and trains a few steps on the CPU. Run prepare.sh
# first.
#
#   bash benchmarks/gpu/simulate.sh [TRAIN OVERRIDES]   # the training bundle (prepare.sh): stage install train
#   bash benchmarks/gpu/simulate.sh pipeline [ARGS]     # the workflow's bundle (prepare.sh --for pipeline): stage
#       install pipeline, the smoke preset's workflow (no book) with the bundle's Snakemake and its edition pack on
#       the CPU; ARGS go to Snakemake (DIFFEQFORMER_PRESET picks another preset)
set -euo pipefail
cd "$(dirname "$0")/../.."
SIM=${DIFFEQFORMER_SIM:-/tmp/diffeqformer-offline-sim}
target=train
if [ "${1:-}" = pipeline ]; then
  target=pipeline
  shift
fi
[ -d .gpu ] || { echo "error: no .gpu/: run benchmarks/gpu/prepare.sh first" >&2; exit 1; }
rm -rf "$SIM" && mkdir -p "$SIM"
"$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$SIM/venv"
.venv/bin/python benchmarks/gpu/bundle.py present --for "$target" > "$SIM/present.txt"
"$SIM/venv/bin/python" -m pip install --quiet --no-deps -r "$SIM/present.txt"
echo "stand-in machine: $(wc -l < "$SIM/present.txt") packages"
export PYTHON="$SIM/venv/bin/python" DIFFEQFORMER_WHEELS="$SIM/wheels" DIFFEQFORMER_SITE="$SIM/site"
parts=$(ls -d .gpu/part-* | sort -V)
last=$(echo "$parts" | tail -1)
for part in $parts; do
  copy="$SIM/copy" && rm -rf "$copy" && mkdir -p "$copy/.gpu"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy" 2>/dev/null || true
  cp -r "$part" "$copy/.gpu/"
  if [ "$part" != "$last" ]; then
    (cd "$copy" && bash benchmarks/gpu/run.sh stage)
  elif [ "$target" = pipeline ]; then
    cp -r --parents data/raw "$copy"
    (cd "$copy" && DIFFEQFORMER_GPU_CHECK=cpu JAX_PLATFORMS=cpu DIFFEQFORMER_EDITION="$SIM/edition" \
      DIFFEQFORMER_PRESET="${DIFFEQFORMER_PRESET:-smoke}" DIFFEQFORMER_COMMIT=simulated \
      bash benchmarks/gpu/run.sh stage install pipeline "$@")
  else
    cp -r --parents data/raw "$copy"
    (cd "$copy" && DIFFEQFORMER_GPU_CHECK=cpu DIFFEQFORMER_GPU_RUN="$SIM/run" JAX_PLATFORMS=cpu \
      bash benchmarks/gpu/run.sh stage install train --trainer.num_train_steps 5 --trainer.train_batch_size 4 \
      --trainer.max_eval_batches 2 --trainer.per_device_eval_parallelism 4 --trainer.mp p=f32 "$@")
  fi
done
