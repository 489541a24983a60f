#!/usr/bin/env bash
# Makes the image's base: a Debian bookworm root file system from Debian's own packages (python3 and venv), as a
# tar file, with mmdebstrap. No container registry is involved, so it builds where none can be reached.
#
# usage: scripts/image/base.sh OUT.tar [ARCH]
# env:   SNAPSHOT=YYYYMMDDTHHMMSSZ  take every package from snapshot.debian.org at that moment (a release does, so
#                                   that two builds of one version hold the same packages); default: the machine's
#                                   configured Debian mirror (CI on a machine that reaches only that mirror)
#        SOURCE_DATE_EPOCH          file times in the tar (default: the last commit's time)
set -euo pipefail
out=${1:?usage: base.sh OUT.tar [ARCH]}
arch=${2:-$(dpkg --print-architecture)}
cd "$(dirname "$0")/../.."
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

mirror=()
if [ -n "${SNAPSHOT:-}" ]; then
  mirror=("http://snapshot.debian.org/archive/debian/$SNAPSHOT"
          "deb http://snapshot.debian.org/archive/debian-security/$SNAPSHOT bookworm-security main")
fi
# minbase + python3: no documentation, manuals or translations (a sidecar reads none of them)
mmdebstrap --quiet --variant=minbase --architectures="$arch" --include=python3,python3-venv \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm "$out" "${mirror[@]}"
