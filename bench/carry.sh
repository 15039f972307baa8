#!/usr/bin/env bash
# Packs `.devcarry/` for bench/scale.sh on the lent machine, which has no
# network: a release hscale, MariaDB's server and clients, sysbench, every
# shared library they use but glibc's, and a fresh data directory. Then, with
# the device tool: command `bench/scale.sh`, carry [".devcarry"].
#
#   bench/carry.sh [path/to/hscale]   (default: a release build of this tree)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
  binary=$1
else
  cargo build --release --quiet --bin hscale
  binary=target/release/hscale
fi
carry=.devcarry
rm -rf "$carry"
mkdir -p "$carry"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx "/$carry/" "$exclude" 2>/dev/null || echo "/$carry/" >>"$exclude"

pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
mkdir -p "$pack/bin" "$pack/lib" "$pack/share/mysql"
cp /usr/sbin/mariadbd /usr/bin/mariadb /usr/bin/mariadb-slap /usr/bin/sysbench "$pack/bin/"
strip -o "$pack/bin/hscale" "$binary"
for file in "$pack"/bin/*; do ldd "$file" | awk '/=>/ {print $3}'; done | sort -u |
  grep -v -E 'libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libresolv' |
  xargs -I{} cp -L {} "$pack/lib/"
cp -r /usr/share/sysbench "$pack/share/"
cp -r /usr/share/mysql/english /usr/share/mysql/charsets "$pack/share/mysql/"
tar cJf "$carry/bundle.txz" -C "$pack" bin lib share
mariadb-install-db --no-defaults --datadir="$pack/data" --auth-root-authentication-method=normal \
  --skip-test-db >/dev/null
tar czf "$carry/datadir.tgz" -C "$pack/data" .
du -sh "$carry"
