#!/usr/bin/env sh
# The tools the AArch64 bundle tests need (tests/targets/llvm/test_bundle.py): qemu-user runs the
# cross-compiled C example, gcc-aarch64-linux-gnu links the bundle and builds the example.
# Installed with Debian's apt where this runs as root and they are missing; anywhere else the tests
# skip and say which tool is missing. Never fails the build.
set -u
if command -v qemu-aarch64 >/dev/null 2>&1 && command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: qemu-aarch64 or aarch64-linux-gnu-gcc is missing (Debian: qemu-user gcc-aarch64-linux-gnu);" \
         "the AArch64 bundle tests will skip" >&2
    exit 0
fi
install() {
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q qemu-user gcc-aarch64-linux-gnu >/dev/null 2>&1
}
install || { timeout 300 apt-get update -q >/dev/null 2>&1 && install; } ||
    echo "note: apt-get could not install qemu-user gcc-aarch64-linux-gnu; the AArch64 bundle tests will skip" >&2
exit 0
