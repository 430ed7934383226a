#!/bin/bash
# make arm64-device: build the arm64 Debian bookworm rootfs once (mmdebstrap), trust the host's CA
# certificates, use its pip configuration, and make a venv with what the agent and `tunaflow run`
# import. tunaflow itself is not installed: every command bind-mounts this checkout (common.sh).
# gcc is there because a process that JIT-loads kernels compiles tunaflow's runtime.c once.
source "$(dirname "$0")/common.sh"
need_root
if [ -e "$READY" ] && [ "$READY" -nt "$(dirname "$0")/requirements.txt" ]; then
    echo "arm64 device ready at $ROOTFS"; exit 0
fi
for tool in mmdebstrap qemu-aarch64-static update-binfmts; do
    command -v "$tool" >/dev/null || die "$tool missing: apt-get install mmdebstrap qemu-user-static binfmt-support"
done
enable_binfmt
mkdir -p "$ARM64_ROOT"
if [ ! -e "$ARM64_ROOT/.rootfs" ]; then
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    rm -rf "$ROOTFS.tmp"  # never mounted: every mount lives in a namespace that died with its command
    echo "building the arm64 rootfs from $mirror (about 5 minutes)"
    mmdebstrap --arch=arm64 --variant=apt --include=python3,python3-venv,python3-pip,ca-certificates,gcc,libc6-dev \
        bookworm "$ROOTFS.tmp" "$mirror"
    rm -rf "$ROOTFS"
    mv "$ROOTFS.tmp" "$ROOTFS"
    touch "$ARM64_ROOT/.rootfs"
fi
# pip inside must trust what the host trusts (a proxy's CA) and use the same index configuration.
mkdir -p "$ROOTFS/usr/local/share/ca-certificates" "$ROOTFS/root/.config/pip"
cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/" 2>/dev/null || true
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOTFS/etc/pip.conf"
[ -f "$HOME/.config/pip/pip.conf" ] && cp "$HOME/.config/pip/pip.conf" "$ROOTFS/root/.config/pip/pip.conf"
[ -f "$HOME/.pip/pip.conf" ] && mkdir -p "$ROOTFS/root/.pip" && cp "$HOME/.pip/pip.conf" "$ROOTFS/root/.pip/"
cp "$(dirname "$0")/requirements.txt" "$ROOTFS/tmp/tunaflow-requirements.txt"
in_device -- /bin/sh -ec "
    update-ca-certificates >/dev/null
    [ -x $VENV/bin/python ] || python3 -m venv $VENV
    command -v gcc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null; }
    env -u PYTHONPATH $VENV/bin/python -m pip install --quiet --disable-pip-version-check -r /tmp/tunaflow-requirements.txt
    $VENV/bin/python -c 'import numpy, llvmlite.binding, pydantic, httpx, pyarrow, typer; print(\"venv ok\")'
"
touch "$READY"
echo "arm64 device ready at $ROOTFS ($(du -sh "$ROOTFS" | cut -f1))"
