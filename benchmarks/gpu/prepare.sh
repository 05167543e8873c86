#!/usr/bin/env bash
# On a machine with network (the package registries): download exactly the wheels that a GPU machine without network
# lacks (bundle.py: what the workflow's processes import, less what benchmarks/gpu/preinstalled-packages.txt says that
# machine has), at requirements.lock's versions, into .gpu/part-K (git-ignored), and prepare the offline corpus
# (data/raw), which travels with them. Arguments go to `bundle.py download`: none for a training, `--for pipeline` for
# the gpu preset's whole workflow (Snakemake, its training and notebook jobs, the edition's pack), `--for measure` for
# benchmarks/gpu/measure.py. Then it says what to run on the GPU machine (benchmarks/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
make setup
.venv/bin/python -m diffeqformer.data prepare
.venv/bin/python benchmarks/gpu/bundle.py download "$@"
du -sh .gpu/part-* data/raw
step=train
for arg in "$@"; do
  case "$arg" in pipeline|measure) step=$arg ;; esac
done
parts=$(ls -d .gpu/part-* | wc -l)
echo
echo "Copy this working tree with .gpu/ and data/raw to the GPU machine; there, in its root:"
if [ "$parts" -gt 1 ]; then
  echo "  (the $parts parts may be copied one at a time: bash benchmarks/gpu/run.sh stage after each)"
fi
echo "  DIFFEQFORMER_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu/run.sh stage install $step"
