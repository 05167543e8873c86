#!/usr/bin/env bash
# Check the notebooks' Colab cell without Colab: a fresh Python 3.12 venv stands in for a Colab runtime (Jupyter,
# Papermill, an older JAX already installed, and a `google.colab` module imported at start, which is what the cell
# looks for), the repository is cloned to /content/diffeqformer as the cell would clone it, and then:
#   1. f6_perplexity runs as a Colab user first runs it: its first cell installs the project (and its JAX); the
#      notebook then stops because no run is trained yet;
#   2. `snakemake -s workflow/Snakefile --cores all notebooks --config preset=smoke`, run in the clone with the
#      Snakemake the cell installed, trains the runs and executes every notebook in that environment (the workflow
#      without its book: the command the cell's comment gives, with the smoke preset on a CPU);
#   3. f6_perplexity runs again on the smoke runs and must finish.
# The GPU branch of the cell (JAX's CUDA 12 build) needs a GPU and is not exercised here.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIM=${DIFFEQFORMER_COLAB_SIM:-/tmp/diffeqformer-colab-sim}
REPO=/content/diffeqformer
PRE_JAX=${PRE_JAX:-0.7.2}
PYTHON=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
rm -rf "$SIM" "$REPO" && mkdir -p "$SIM" /content
git clone -q "$PWD" "$REPO"
"$PYTHON" -m venv "$SIM/venv"
V="$SIM/venv/bin"
"$V/python" -m pip install -q --upgrade pip
"$V/python" -m pip install -q ipykernel papermill "jax==$PRE_JAX" "jaxlib==$PRE_JAX" numpy pandas matplotlib
SP=$("$V/python" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$SP/google/colab"
echo '"""Stand-in for Colab: the notebooks look for this module."""' > "$SP/google/colab/__init__.py"
echo '"""Stand-in: JAX imports google.colab.output when it sees Colab."""' > "$SP/google/colab/output.py"
echo "import google.colab" > "$SP/zz_colab_stand_in.pth"  # Colab's kernel has it imported from the start
"$V/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
cd "$SIM"
if "$V/papermill" "$REPO/notebooks/f6_perplexity.ipynb" first.ipynb --cwd /content > first.log 2>&1; then
  echo "error: the first run should stop for want of trained runs" >&2; exit 1
fi
grep -q "no finished run there" first.log || { echo "error: see $SIM/first.log" >&2; exit 1; }
echo "after the Colab cell: $("$V/python" -c 'import importlib.metadata as m; print("jax", m.version("jax"), "marin-levanter", m.version("marin-levanter"), "diffeqformer", m.version("diffeqformer"))')"
start=$(date +%s)
(cd "$REPO" && "$V/snakemake" -s workflow/Snakefile --cores all notebooks --config preset=smoke \
  > "$SIM/workflow.log" 2>&1) || { echo "error: the smoke workflow failed, see $SIM/workflow.log" >&2; exit 1; }
echo "the smoke workflow (no book) in $(( $(date +%s) - start )) s:" \
  "$(grep -E 'steps \(100%\) done' "$SIM/workflow.log" | tail -1)"
"$V/papermill" "$REPO/notebooks/f6_perplexity.ipynb" second.ipynb --cwd /content -y \
  '{"preset": "smoke", "runs": {"gpt": "runs/smoke-gpt2", "shared": "runs/smoke-shared", "ours": "runs/smoke-diffeqformer"}}' \
  > second.log 2>&1 || { echo "error: see $SIM/second.log" >&2; exit 1; }
echo "f6_perplexity on the smoke runs: finished, $(grep -c '"image/png"' second.ipynb) figure(s) in its outputs"
