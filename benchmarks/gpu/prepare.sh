#!/usr/bin/env bash
# Here (with the internet of the package registries): download exactly the wheels a lent GPU machine lacks for
# training this project, at requirements.lock's versions, cut into parts the device tool can carry (.gpu/part-K,
# git-ignored), and the offline corpus's archive (data/raw) that must travel with the last part.
# Then benchmarks/gpu/run.sh says how to stage, install and train there.
set -euo pipefail
cd "$(dirname "$0")/../.."
make setup
.venv/bin/python -m diffeqformer.data prepare
.venv/bin/python benchmarks/gpu/bundle.py download "$@"
du -sh .gpu/part-* data/raw
last=$(ls -d .gpu/part-* | sort -V | tail -1)
echo
echo "On the lent machine (device tool), one call per part, each at once after the one before:"
for part in $(ls -d .gpu/part-* | sort -V); do
  if [ "$part" = "$last" ]; then
    echo "  carry [\"$part\", \"data/raw\"]: bash benchmarks/gpu/run.sh stage install train"
  else
    echo "  carry [\"$part\"]: bash benchmarks/gpu/run.sh stage"
  fi
done
