#!/usr/bin/env bash
# `make deb`: builds $BUILD/nas_$VERSION_$ARCH.deb with dpkg-deb from `make install` into a
# staging folder (PREFIX=/usr, the Python client also linked into Python's dist-packages).
# dpkg-shlibdeps, Debian's own tool, reads the libraries bin/nas links against and writes
# Depends with the packages and versions that provide them; python3 (for the client) is
# recommended. The files belong to root in the package whoever builds it.
set -euo pipefail
: "${BUILD:?}" "${BIN:?}" "${VERSION:?}"
arch=$(dpkg --print-architecture)
work=$BUILD/deb
root=$work/debian/nas # where dpkg-shlibdeps expects a package's files
rm -rf "$work"
mkdir -p "$root/DEBIAN"
# `make deb` has just made $BIN/nas: -o keeps this make from rebuilding it in $BUILD.
make --no-print-directory install DESTDIR="$root" PREFIX=/usr \
  PYTHONDIR=/usr/lib/python3/dist-packages BUILD="$BUILD" BIN="$BIN" -o "$BIN/nas" >/dev/null
install -Dm644 /dev/stdin "$root/usr/share/doc/nas/copyright" <<'TEXT'
nas: multi-objective Bayesian optimisation of experiments (HPO and NAS).
The digits data (share/nas/digits.csv.gz) is scikit-learn's copy of the UCI optical
recognition of handwritten digits data set.
TEXT

# dpkg-shlibdeps reads debian/control for the package's name; a stub serves.
printf 'Source: nas\n\nPackage: nas\nArchitecture: any\n' >"$work/debian/control"
depends=$(cd "$work" && dpkg-shlibdeps -O debian/nas/usr/bin/nas | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "deb.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

cat >"$root/DEBIAN/control" <<TEXT
Package: nas
Version: $VERSION
Architecture: $arch
Maintainer: nas developers <nas@localhost>
Section: science
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Recommends: python3
Description: multi-objective Bayesian optimisation of experiments (HPO, NAS)
 nas runs hyperparameter and neural-architecture searches described in YAML:
 a Gaussian-process optimizer suggests trials, runners start them on this
 machine or through Slurm, and SQLite or PostgreSQL keeps every result.
TEXT
deb=$BUILD/nas_${VERSION}_$arch.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
