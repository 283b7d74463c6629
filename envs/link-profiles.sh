#!/usr/bin/env bash
# Link this checkout's site profiles (profiles/*, not default) into ~/.config/snakemake
# (envs/setup.sh calls it; tests/unit/test_link_profiles.py runs it with XDG_CONFIG_HOME
# pointing elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# `snakemake --profile slurm_a800` resolves bare names in ~/.config/snakemake, not in
# ./profiles: link every site profile there (profiles/default is the workflow profile,
# loaded from the repo automatically). A name already there is replaced only when it is
# ours: a link to a site profile of this or another llmbench checkout, or a dangling link
# to one. A profile of the user's own (a folder, or a link elsewhere) is left as it is,
# and set-up says so.
cfg=${XDG_CONFIG_HOME:-$HOME/.config}/snakemake
mkdir -p "$cfg"
ours() {  # ours LINK NAME: LINK points at profiles/NAME of an llmbench checkout (or did)
  local target
  [[ -L $1 ]] || return 1
  target=$(readlink "$1")
  [[ $target == */profiles/$2 ]] || return 1
  [[ ! -e $target || -d ${target%/profiles/$2}/workflow/scripts/llmbench ]]
}
for dir in profiles/*/; do
  name=$(basename "$dir")
  [[ $name == default ]] && continue
  link=$cfg/$name
  if [[ -e $link || -L $link ]] && ! ours "$link" "$name"; then
    echo "set-up: $link exists and is not an llmbench profile: left as it is (use --profile $root/profiles/$name)" >&2
    continue
  fi
  ln -sfn "$root/profiles/$name" "$link"
done
