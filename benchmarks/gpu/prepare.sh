#!/usr/bin/env bash
# Here (with the internet of the package registries): download exactly the wheels a lent GPU machine lacks, at
# requirements.lock's versions, cut into parts the device tool can carry (.gpu/part-K, git-ignored), and the
# offline corpus's archive (data/raw) that must travel with the last part. Arguments go to `bundle.py download`:
# none for a training, `--for pipeline` for the whole gpu pipeline (one part of 55 MiB), `--for measure` for
# benchmarks/gpu/measure.py. Then benchmarks/gpu/run.sh says how to stage, install and run there.
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
last=$(ls -d .gpu/part-* | sort -V | tail -1)
echo
echo "On the lent machine (device tool), one call per part, each at once after the one before:"
for part in $(ls -d .gpu/part-* | sort -V); do
  if [ "$part" = "$last" ]; then
    echo "  carry [\"$part\", \"data/raw\"]: DIFFEQFORMER_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu/run.sh stage install $step"
  else
    echo "  carry [\"$part\"]: bash benchmarks/gpu/run.sh stage"
  fi
done
