#!/usr/bin/env bash
# Builds the `stratus:local` container image from this checkout's own release binary.
#
# No image registry is needed (or reachable): the image is a minimal root filesystem assembled
# here — the binary, the shared libraries `ldd` lists, the dynamic loader, /etc/nsswitch.conf,
# /etc/passwd, empty /etc/hosts and /etc/resolv.conf for the engine to mount over, and /tmp,
# /data — turned into an image with `docker import` (the equivalent of FROM scratch + COPY).
#
# Usage: deploy/build-image.sh [--no-build] [--profile release|debug] [--tag TAG]
#   CARGO_TARGET_DIR  where cargo builds (default: target/ of this checkout); reused as is
#   --no-build        do not run cargo; package the binary already in $CARGO_TARGET_DIR/<profile>
#   --profile P       release (default: what users deploy) or debug (the binary `cargo test`
#                     already built, which CI packages to spare a second whole build)
#   --tag TAG         image tag (default stratus:local)
set -euo pipefail
cd "$(dirname "$0")/.."

tag="stratus:local"
build=1
profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --tag) tag="$2"; shift ;;
        --profile) profile="$2"; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

case "$profile" in
    release) cargo_profile_flag=(--release) ;;
    debug) cargo_profile_flag=() ;;
    *) echo "build-image.sh: --profile is release or debug, not $profile" >&2; exit 2 ;;
esac

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
binary="$target_dir/$profile/stratus"
if [ "$build" = 1 ]; then
    echo "build-image.sh: cargo build ${cargo_profile_flag[*]} -p stratus (CARGO_TARGET_DIR=$target_dir)" >&2
    CARGO_TARGET_DIR="$target_dir" cargo build "${cargo_profile_flag[@]}" -p stratus
fi
if [ ! -x "$binary" ]; then
    echo "build-image.sh: no binary at $binary (run without --no-build)" >&2
    exit 1
fi
docker info >/dev/null 2>&1 || { echo "build-image.sh: no Docker daemon (docker info failed)" >&2; exit 1; }

rootfs="$(mktemp -d "${TMPDIR:-/tmp}/stratus-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT

mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/data" "$rootfs/proc" \
    "$rootfs/sys" "$rootfs/dev"
chmod 1777 "$rootfs/tmp"
cp "$binary" "$rootfs/usr/local/bin/stratus"

# Every shared library the binary needs, and the dynamic loader, at the paths ldd reports (the
# loader's path is compiled into the binary, the libraries are found through it).
libraries="$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')"
if [ -z "$libraries" ]; then
    echo "build-image.sh: ldd listed no libraries for $binary; is it dynamically linked?" >&2
fi
for library in $libraries; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
done
# glibc >= 2.34 has the files and dns name services built in: hostnames resolve through the
# engine's /etc/hosts and its embedded DNS (container names and network aliases).
cat > "$rootfs/etc/nsswitch.conf" <<'NSS'
passwd: files
group: files
hosts: files dns
NSS
echo 'root:x:0:0:root:/:/usr/local/bin/stratus' > "$rootfs/etc/passwd"
echo 'root:x:0:' > "$rootfs/etc/group"
: > "$rootfs/etc/hosts"
: > "$rootfs/etc/resolv.conf"
: > "$rootfs/etc/hostname"

# The binary must run in exactly this tree: check it here, before the engine sees it.
if command -v chroot >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    chroot "$rootfs" /usr/local/bin/stratus --version >/dev/null \
        || { echo "build-image.sh: the binary does not run in the assembled root filesystem" >&2; exit 1; }
fi

version="$("$binary" --version | awk '{ print $2 }')"
revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf - . \
    | docker import \
        --change 'ENTRYPOINT ["/usr/local/bin/stratus"]' \
        --change 'WORKDIR /data' \
        --change 'ENV PATH=/usr/local/bin' \
        --change 'ENV NO_COLOR=1' \
        --change "LABEL org.opencontainers.image.title=stratus org.opencontainers.image.version=$version org.opencontainers.image.revision=$revision" \
        --message "stratus $version ($revision) from $binary" \
        - "$tag" >/dev/null
echo "build-image.sh: built $tag ($(du -sh "$rootfs" | cut -f1) root filesystem, stratus $version, revision $revision)"
