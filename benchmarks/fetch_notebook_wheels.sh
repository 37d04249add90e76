#!/usr/bin/env bash
# Download nbclient + ipykernel (and what they need beyond the GPU image) as wheels for the GPU
# machine's Python 3.12 into .whl/ (git-ignored); gpu_all.sh installs them there to run the notebooks.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux1_x86_64)
for p in nbclient nbformat jupyter_client jupyter_core traitlets fastjsonschema jsonschema referencing rpds-py \
         jsonschema-specifications ipykernel comm debugpy ipython jedi parso prompt_toolkit wcwidth stack_data \
         executing asttokens pure_eval decorator pexpect ptyprocess matplotlib-inline nest_asyncio pyzmq tornado \
         platformdirs ipython_pygments_lexers; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "$p"
done
ls .whl
