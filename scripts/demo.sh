#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs the demo.
# (Until the elastic training demo exists: a planning demo for a GPT preset.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
T=build/bin/tenplex
echo "== layout of gpt3-1.3b with tp=2,pp=2,dp=2"
$T layout --model gpt3-1.3b --config tp=2,pp=2,dp=2
