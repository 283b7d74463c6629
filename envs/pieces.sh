#!/usr/bin/env bash
# Move a folder to a machine that can be sent only so much at a time, in checked pieces.
#
#   bash envs/pieces.sh pack DIR NAME MIB   # DIR/NAME/ -> DIR/NAME.txz.part-000, -001, ...
#                                           #   + DIR/NAME.txz.parts (sha256 of each piece)
#                                           #   + DIR/NAME.txz.sha256 (sha256 of the whole)
#   bash envs/pieces.sh unpack DIR NAME     # the reverse, on the receiving side: every piece is
#                                           #   checked first (a missing or damaged one is named),
#                                           #   then the reassembled archive, then DIR/NAME/ is made
#
# The folder travels as one xz-compressed tar (NAME.txz). Its wheels are first rewritten
# uncompressed (the same files, stored rather than deflated; pip installs either): the GPU
# engines' wheels are mostly CUDA kernel libraries, whose fat binaries repeat across GPU
# architectures over distances that a wheel's per-file deflate cannot see and xz's window
# can: SGLang's GPU set is 577 MiB of wheels and 304 MiB in xz, vLLM's slim set 219 and 153,
# so several transfers fewer. XZ_LEVEL (default 6) trades packing time for size.
#
# envs/wheelhouse.sh packs the engines' GPU wheels this way (PIECES_MIB) and
# envs/offline-run.sh unpacks them. The pieces may arrive over several transfers: gather
# them in DIR first.
set -euo pipefail
cmd=${1:?usage: pieces.sh pack DIR NAME MIB | unpack DIR NAME}
dir=${2:?missing DIR}
name=${3:?missing NAME}
cd "$dir"
case $cmd in
pack)
    mib=${4:?missing MIB}
    [[ -d $name ]] || { echo "pieces: no folder $dir/$name to pack" >&2; exit 1; }
    rm -f "$name".txz "$name".txz.part-* "$name".txz.parts "$name".txz.sha256
    python3 - "$name" <<'PY'
import pathlib, shutil, sys, zipfile
for whl in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    if not zipfile.is_zipfile(whl):
        continue
    stored = whl.with_name(whl.name + ".stored")
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED, allowZip64=True) as dst:
        for info in src.infolist():
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr, out.file_size = info.external_attr, info.file_size  # modes kept
            with src.open(info) as r, dst.open(out, "w", force_zip64=info.file_size > 2**30) as w:
                shutil.copyfileobj(r, w, 2**24)
    stored.replace(whl)
PY
    tar -cf - "$name" | xz -"${XZ_LEVEL:-6}" -T0 > "$name.txz"
    split -d -a 3 -b "${mib}M" "$name.txz" "$name.txz.part-"
    sha256sum "$name.txz" > "$name.txz.sha256"
    sha256sum "$name".txz.part-* > "$name.txz.parts"
    rm -rf "$name.txz" "$name"
    echo "pieces: $(wc -l < "$name.txz.parts") pieces of at most $mib MiB in $dir"
    ;;
unpack)
    [[ -f $name.txz.parts && -f $name.txz.sha256 ]] \
        || { echo "pieces: $dir has no $name.txz.parts and $name.txz.sha256" >&2; exit 1; }
    missing=$(awk '{print $2}' "$name.txz.parts" | while read -r p; do [[ -f $p ]] || echo "$p"; done)
    [[ -z $missing ]] || { echo "pieces: missing in $dir: $(echo $missing)" >&2; exit 1; }
    sha256sum --quiet -c "$name.txz.parts" || { echo "pieces: a piece of $name is damaged (above)" >&2; exit 1; }
    awk '{print $2}' "$name.txz.parts" | xargs cat > "$name.txz"
    sha256sum --quiet -c "$name.txz.sha256" || { echo "pieces: reassembled $name.txz does not match its checksum" >&2; rm -f "$name.txz"; exit 1; }
    rm -rf "$name"
    if command -v xz > /dev/null; then
        xz -dc "$name.txz" | tar -xf -
    else  # a node without xz-utils: Python's lzma reads the same stream
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer, 2**24)' "$name.txz" | tar -xf -
    fi
    rm "$name.txz"
    echo "pieces: $dir/$name reassembled from $(wc -l < "$name.txz.parts") checked pieces"
    ;;
*)
    echo "usage: pieces.sh pack DIR NAME MIB | unpack DIR NAME" >&2
    exit 2
    ;;
esac
