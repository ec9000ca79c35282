#!/usr/bin/env bash
# Set up (if needed) and run the default job: DLRM on dmt's planted synthetic data.
# Extra arguments are Hydra overrides, e.g. `bash scripts/quickstart.sh model=dcn`.
#
# The job runs in the repository, wherever you start the script: its run directory is the
# repository's outputs/<date>/<time>-<pid>/ (README, Quick start), and the configs' relative data
# paths (../shared/data/..., data_cache/...) are read from there. A relative run or sweep
# directory you give (hydra.run.dir=DIR, hydra.sweep.dir=DIR) is taken from the directory you run
# the script in, as any output path a user names is; other relative paths in overrides (data
# files, model.partition.path) are read from the repository, like the configs' own.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
for arg in "$@"; do
    if [[ "$arg" =~ ^(\+{0,2}hydra\.(run|sweep)\.dir=)(.+)$ ]]; then
        key="${BASH_REMATCH[1]}" value="${BASH_REMATCH[3]}" quote="'"
        # a quoted value keeps its quotes (and its escapes); the caller's directory goes inside
        # them, escaped (a Hydra string: it may hold spaces, commas or quotes)
        if [[ "$value" =~ ^\'(.*)\'$ || "$value" =~ ^\"(.*)\"$ ]]; then
            quote="${value:0:1}" value="${BASH_REMATCH[1]}"
        else
            value="${value//\'/\\\'}"
        fi
        # (a value that is absolute or starts with an interpolation stays as it is)
        if [[ "$value" != /* && "$value" != \$* ]]; then
            arg="$key$quote${PWD//"$quote"/\\$quote}/$value$quote"
        fi
    fi
    args+=("$arg")
done
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/dmt-train" ${args[@]+"${args[@]}"}
