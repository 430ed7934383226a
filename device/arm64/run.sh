#!/bin/bash
# make arm64-run LIB=DIR INPUTS=in.npz OUTPUT=out.npz [RUN_ARGS=...]: `tunaflow run` on a library inside
# the device. LIB and the inputs are bound read-only, the output's directory read-write.
source "$(dirname "$0")/common.sh"
need_root
need_device
lib=${1:?usage: run.sh LIB INPUTS OUTPUT [tunaflow run options...]} inputs=${2:-} output=${3:-}
shift $(( $# < 3 ? $# : 3 ))
[ -d "$lib" ] || die "LIB $lib: no such directory"
binds=("$(realpath "$lib"):/mnt/lib:ro")
args=(run /mnt/lib)
if [ -n "$inputs" ]; then
    [ -f "$inputs" ] || die "INPUTS $inputs: no such file"
    binds+=("$(realpath "$inputs"):/mnt/in/$(basename "$inputs"):ro")
    args+=(--inputs "/mnt/in/$(basename "$inputs")")
fi
if [ -n "$output" ]; then
    outdir=$(dirname "$output")
    [ -d "$outdir" ] || die "OUTPUT $output: directory $outdir does not exist"
    binds+=("$(realpath "$outdir"):/mnt/out:rw")
    args+=(--output "/mnt/out/$(basename "$output")")
fi
in_device "${binds[@]}" -- python -m tunaflow "${args[@]}" "$@"
