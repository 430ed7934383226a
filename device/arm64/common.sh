# Shared by the arm64 device scripts: where the device lives and how commands enter it.
# Every mount is made inside a private mount namespace (unshare), so it disappears with the
# command, also on Ctrl-C or kill: nothing is ever left mounted in the host's namespace, and
# deleting the rootfs can never reach the host's /dev, /proc or /sys.
set -euo pipefail

ARM64_ROOT=${ARM64_ROOT:-$HOME/.cache/tunaflow/arm64}
ROOTFS=$ARM64_ROOT/rootfs
READY=$ARM64_ROOT/.ready
CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=/opt/tunaflow-venv
# The CPU qemu emulates: the board's (default ARM64_CPU), so an instruction the board lacks (SVE on a
# Cortex-A76) traps in the device as it would on the board; qemu's default `max` has every extension.
QEMU_CPU=${ARM64_QEMU_CPU:-${ARM64_CPU:-cortex-a76}}

die() { echo "arm64-device: $*" >&2; exit 2; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, chroot and mounts)"; }

# The kernel must hand aarch64 ELF files to qemu (binfmt_misc with the fix-binary flag, so the
# interpreter need not exist inside the rootfs).
enable_binfmt() {
    command -v qemu-aarch64-static >/dev/null || die "qemu-aarch64-static missing: apt-get install qemu-user-static binfmt-support"
    [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
    grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "binfmt entry qemu-aarch64 is disabled"
    local cpus
    cpus=$(qemu-aarch64-static -cpu help | sed -n 's/^ \+//p' || true)  # help exits 1
    grep -qx "$QEMU_CPU" <<< "$cpus" ||
        die "qemu emulates no CPU '$QEMU_CPU' (ARM64_QEMU_CPU, default ARM64_CPU); it knows:" $cpus
}

need_device() {
    [ -e "$READY" ] || die "no device at $ROOTFS: run 'make arm64-device' first (or set ARM64_ROOT)"
}

# in_device [SRC:DST:ro|rw ...] -- CMD...: run CMD inside the rootfs as aarch64, with /proc (showing an
# arm64 cpuinfo, below), a fresh /dev/shm (multiprocessing), no /sys (the host's caches are not the
# board's: see --caches), this checkout read-only at /tunaflow (imported from there, so the device always
# runs the checkout's code: nothing to reinstall, nothing to drift; bytecode is cached under /var/cache
# in the rootfs, keyed on the sources) and the given host files or directories bound at DST.
in_device() {
    local binds=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do binds+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    enable_binfmt
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"  # the host's DNS, for pip and apt
    # qemu-user shows the host's x86 /proc/cpuinfo, where LLVM finds no aarch64 features at all (not even
    # NEON, so the loader refuses every aarch64 library): the device reads the ARMv8-A baseline every arm64
    # Linux board reports (fp, asimd), which qemu executes; its CPU stays `generic` (see --cpu).
    local cpuinfo=$ARM64_ROOT/cpuinfo
    for ((cpu = 0; cpu < $(nproc); cpu++)); do
        printf 'processor\t: %d\nFeatures\t: fp asimd\nCPU architecture: 8\n\n' "$cpu"
    done > "$cpuinfo"
    binds=("$cpuinfo:/proc/cpuinfo:ro" "${binds[@]}")
    unshare --mount --propagation private -- /bin/bash -euo pipefail -c '
        rootfs=$1 checkout=$2 venv=$3 qemu_cpu=$4 nbinds=$5; shift 5
        mount -t proc proc "$rootfs/proc"
        mount -t tmpfs -o mode=1777 tmpfs "$rootfs/dev/shm"
        mkdir -p "$rootfs/tunaflow"
        mount --bind "$checkout" "$rootfs/tunaflow"
        mount -o remount,bind,ro "$rootfs/tunaflow"
        for ((i = 0; i < nbinds; i++)); do
            spec=$1; shift
            src=${spec%%:*} rest=${spec#*:} dst=${rest%%:*} mode=${rest#*:}
            if [ -d "$src" ]; then mkdir -p "$rootfs$dst"; else mkdir -p "$(dirname "$rootfs$dst")"; touch "$rootfs$dst"; fi
            mount --bind "$src" "$rootfs$dst"
            if [ "$mode" = ro ]; then mount -o remount,bind,ro "$rootfs$dst"; fi
        done
        exec chroot "$rootfs" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" QEMU_CPU="$qemu_cpu" \
            PATH="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            PYTHONPATH=/tunaflow PYTHONPYCACHEPREFIX=/var/cache/tunaflow-pyc "$@"
    ' in_device "$ROOTFS" "$CHECKOUT" "$VENV" "$QEMU_CPU" "${#binds[@]}" "${binds[@]}" "$@"
}
