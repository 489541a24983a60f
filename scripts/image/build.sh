#!/usr/bin/env bash
# Builds the sidecar image without a daemon or a registry, reproducibly: the base with mmdebstrap
# (scripts/image/base.sh), the wheels it installs (the exporter's and every pinned dependency, for the image's
# architecture) into image/wheels/, then the image from Containerfile with buildah, chroot isolation, with BASE
# replaced by that base. Prints the image's name. (`docker build .` takes the Containerfile's default base and the
# package index instead.)
#
# usage: scripts/image/build.sh [NAME]      (default localhost/posttrain-exporter:VERSION)
# env:   ARCH      the image's Debian architecture (default: this machine's; arm64 on amd64 needs qemu-user-static)
#        BASE_TAR  reuse a base made before (default: build/base-ARCH-HASH.tar, made when missing; HASH is base.sh's,
#                  so that a changed base.sh makes a new one)
#        STORAGE_DRIVER  buildah's storage (default vfs: works in any container or VM, no overlay needed)
# needs:  buildah, mmdebstrap, python3 with pip, binutils (strip; binutils-aarch64-linux-gnu for arm64 on amd64)
set -euo pipefail
cd "$(dirname "$0")/../.."
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
version=$(sed -n 's/^VERSION = "\(.*\)"$/\1/p' exporter/buildinfo.py)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
name=${1:-localhost/posttrain-exporter:$version}
arch=${ARCH:-$(dpkg --print-architecture)}
base_tar=${BASE_TAR:-build/base-$arch-$(sha256sum scripts/image/base.sh | cut -c1-12).tar}
base=localhost/posttrain-exporter-base:bookworm-$arch

if [ ! -s "$base_tar" ]; then
  mkdir -p "$(dirname "$base_tar")"
  scripts/image/base.sh "$base_tar.part.tar" "$arch" >&2  # mmdebstrap writes a tarball for a name ending in .tar
  mv "$base_tar.part.tar" "$base_tar"
fi
ctr=$(buildah from --arch "$arch" scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$base_tar" / >/dev/null
buildah commit --quiet --rm "$ctr" "$base" >/dev/null
trap - EXIT

# The wheels: the exporter's, built here (pure Python), and every pinned dependency for the image's architecture
# and Python (bookworm's 3.11, glibc 2.36). The image installs from these alone.
wheels=image/wheels
rm -rf "$wheels" && mkdir -p "$wheels"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$wheels" . >&2
case $arch in amd64) plat=x86_64 ;; arm64) plat=aarch64 ;; *) plat=$arch ;; esac
grep -v -e '^setuptools==' -e '^#' image/constraints.txt > "$wheels/requirements.txt"  # no build backend: wheels only
platforms=()
for p in manylinux2014 manylinux_2_17 manylinux_2_28 manylinux_2_34; do platforms+=(--platform "${p}_$plat"); done
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" --python-version 3.11 \
  --implementation cp --abi cp311 --abi abi3 --abi none "${platforms[@]}" --platform any \
  -r "$wheels/requirements.txt" >&2
# debugging information: never read in the image (another architecture's needs its binutils' strip)
if [ "$arch" != "$(dpkg --print-architecture)" ]; then
  case $arch in arm64) export STRIP=${STRIP:-aarch64-linux-gnu-strip} ;; *) export STRIP=${STRIP:-$plat-linux-gnu-strip} ;; esac
fi
python3 scripts/image/strip_wheels.py "$wheels"/*.whl

buildah bud --isolation chroot --quiet --layers=false --arch "$arch" -f Containerfile \
  --build-arg BASE="$base" --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  -t "$name" . >&2
echo "$name"
