#!/usr/bin/env bash
# Move a folder to a machine that can be sent only so much at a time, in checked pieces.
#
#   bash envs/pieces.sh pack DIR NAME MIB   # DIR/NAME/ -> DIR/NAME.tar.part-000, -001, ...
#                                           #   + DIR/NAME.tar.parts (sha256 of each piece)
#                                           #   + DIR/NAME.tar.sha256 (sha256 of the whole tar)
#   bash envs/pieces.sh unpack DIR NAME     # the reverse, on the receiving side: every piece is
#                                           #   checked first (a missing or damaged one is named),
#                                           #   then the reassembled tar, then DIR/NAME/ is made
#
# envs/wheelhouse.sh packs vLLM's GPU wheels this way (PIECES_MIB) and envs/offline-run.sh
# unpacks them. The pieces may arrive over several transfers: gather them in DIR first.
set -euo pipefail
cmd=${1:?usage: pieces.sh pack DIR NAME MIB | unpack DIR NAME}
dir=${2:?missing DIR}
name=${3:?missing NAME}
cd "$dir"
case $cmd in
pack)
    mib=${4:?missing MIB}
    [[ -d $name ]] || { echo "pieces: no folder $dir/$name to pack" >&2; exit 1; }
    rm -f "$name".tar "$name".tar.part-* "$name".tar.parts "$name".tar.sha256
    tar -cf "$name.tar" "$name"
    split -d -a 3 -b "${mib}M" "$name.tar" "$name.tar.part-"
    sha256sum "$name.tar" > "$name.tar.sha256"
    sha256sum "$name".tar.part-* > "$name.tar.parts"
    rm -rf "$name.tar" "$name"
    echo "pieces: $(wc -l < "$name.tar.parts") pieces of at most $mib MiB in $dir"
    ;;
unpack)
    [[ -f $name.tar.parts && -f $name.tar.sha256 ]] \
        || { echo "pieces: $dir has no $name.tar.parts and $name.tar.sha256" >&2; exit 1; }
    missing=$(awk '{print $2}' "$name.tar.parts" | while read -r p; do [[ -f $p ]] || echo "$p"; done)
    [[ -z $missing ]] || { echo "pieces: missing in $dir: $(echo $missing)" >&2; exit 1; }
    sha256sum --quiet -c "$name.tar.parts" || { echo "pieces: a piece of $name is damaged (above)" >&2; exit 1; }
    awk '{print $2}' "$name.tar.parts" | xargs cat > "$name.tar"
    sha256sum --quiet -c "$name.tar.sha256" || { echo "pieces: reassembled $name.tar does not match its checksum" >&2; rm -f "$name.tar"; exit 1; }
    rm -rf "$name"
    tar -xf "$name.tar"
    rm "$name.tar"
    echo "pieces: $dir/$name reassembled from $(wc -l < "$name.tar.parts") checked pieces"
    ;;
*)
    echo "usage: pieces.sh pack DIR NAME MIB | unpack DIR NAME" >&2
    exit 2
    ;;
esac
