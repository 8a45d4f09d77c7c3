#!/usr/bin/env bash
# A population across machines as a Slurm array job: each array task is one member, an ordinary
# sfbus run on its own node, and the members meet only in a folder on a shared file system
# (docs/TOOLS.md, "Populations across machines"). Submit from the repository root:
#   sbatch --array=0-7 scripts/slurm_population.sh
# and again with the same --array to resume every member after a node loss or a time limit
# (a task whose run directory exists resumes it). Settings through the environment:
#   POPULATION_ROOT  shared folder for run directories and records (default: $PWD/population_runs)
#   TOPOLOGY         the member's topology (default: topologies/cartpole_population_member.yaml)
#   SFBUS            the sfbus command (default: .venv/bin/sfbus)
#   extra arguments to sbatch's script are passed on to `sfbus run` (e.g. --max-frames 1e8)
#SBATCH --job-name=sfbus-population
#SBATCH --array=0-3
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=population_%A_%a.out
set -euo pipefail

root=${POPULATION_ROOT:-$PWD/population_runs}
topology=${TOPOLOGY:-topologies/cartpole_population_member.yaml}
sfbus=${SFBUS:-.venv/bin/sfbus}
task=${SLURM_ARRAY_TASK_ID:?run this script with sbatch --array}
member="task_${task}"
run_dir="$root/$member"
mkdir -p "$root/records"

common=(--set "population_folder=$root/records" --set "population_member=$member"
        --set "seed=$task")
if [[ -d "$run_dir/checkpoints" ]]; then
    echo "member $member resumes $run_dir on $(hostname)"
    exec "$sfbus" run "$topology" --resume "$run_dir" "${common[@]}" "$@"
fi
echo "member $member starts $run_dir on $(hostname)"
exec "$sfbus" run "$topology" --run-dir "$run_dir" "${common[@]}" "$@"
