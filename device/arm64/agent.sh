#!/bin/bash
# make arm64-agent TRACKER=HOST:PORT KEY=KEY TOKEN_FILE=F [ARM64_CPU=cortex-a76] [ARM64_CACHES=64K,512K,2M]:
# `tunaflow runner serve` inside the device, in the foreground, until Ctrl-C. The emulated CPU reads as
# generic and shows no caches, so the agent registers ARM64_CPU and ARM64_CACHES (empty: what it detects).
# The token file is bound read-only, never copied.
source "$(dirname "$0")/common.sh"
need_root
need_device
tracker=${1:?usage: agent.sh HOST:PORT KEY TOKEN_FILE [CPU]} key=${2:?KEY missing} token=${3:?TOKEN_FILE missing}
cpu=${4:-} caches=${5:-}
[ -f "$token" ] || die "TOKEN_FILE $token: no such file"
args=(runner serve --tracker "$tracker" --key "$key" --token-file /run/tunaflow/token --name "arm64-qemu:$key")
[ -n "$cpu" ] && args+=(--cpu "$cpu")
[ -n "$caches" ] && args+=(--caches "$caches")
in_device "$(realpath "$token"):/run/tunaflow/token:ro" -- python -m tunaflow "${args[@]}"
