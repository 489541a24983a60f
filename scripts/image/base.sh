#!/usr/bin/env bash
# Makes the image's base: a Debian bookworm root file system from Debian's own packages, as a tar file, with
# mmdebstrap. No container registry is involved, so it builds where none can be reached. What it holds: Debian's
# Essential packages, python3, passwd (useradd) and libstdc++6 (numpy's C++ core links the system's, as manylinux
# wheels may; python3 does not bring it): no apt, no pip, no venv module's wheels (the image installs its
# wheels with scripts/image/install_wheels.py), no perl beyond perl-base (merged /usr is set up by mmdebstrap's
# hook, not by the usrmerge package, which brings perl with it).
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
# No documentation, manuals or translations (a sidecar reads none of them), no iconv modules (Python decodes without
# them; UTF-8 and ASCII are built into the C library).
mmdebstrap --quiet --variant=essential --architectures="$arch" --include=python3,passwd,libstdc++6 \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/bash-completion/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --dpkgopt='path-exclude=/usr/lib/*/gconv/*' --dpkgopt='path-include=/usr/lib/*/gconv/gconv-modules*' \
  bookworm "$out" "${mirror[@]}"
