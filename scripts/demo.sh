#!/usr/bin/env bash
# quill's main job on a default image: build, make a 256 MiB ext4 image, mount it through FUSE,
# run a short workload (unpack this source tree, fsync-heavy small writes, read it all back),
# unmount, then show `quill info` and let e2fsck judge the image.
#
#   scripts/demo.sh [WORKDIR]      (default: a fresh directory under /tmp)
#
# Needs /dev/fuse, and root or a user allowed to mount FUSE file systems; as root on Debian it
# installs what else it needs (fuse3, e2fsprogs) with apt-get, as .ci/run does.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/quill-demo.XXXXXX)}"
image="$work/quill.img"
mnt="$work/mnt"

# Installs fuse3, e2fsprogs and tar when they are missing (root, Debian), as .ci/run does.
"$repo/scripts/install-tools.sh" fusermount3:fuse3 e2fsck:e2fsprogs tar:tar flock:util-linux \
  || { echo "demo: cannot continue without those tools" >&2; exit 1; }
[ -e /dev/fuse ] || { echo "demo: /dev/fuse is missing (modprobe fuse)" >&2; exit 1; }

echo "== build"
cargo build --release -p quill --manifest-path "$repo/Cargo.toml" 2>&1 | tail -1
quill="$repo/target/release/quill"

echo "== quill mkfs $image 256M"
mkdir -p "$mnt"
"$quill" mkfs -F "$image" 256M

echo "== quill mount $image $mnt"
"$quill" mount "$image" "$mnt"
cleanup() { mountpoint -q "$mnt" && umount "$mnt" || true; }
trap cleanup EXIT
df -T "$mnt" | tail -1

echo "== workload: unpack the source tree, 200 fsynced appends, read everything back"
start=$(date +%s%N)
mkdir "$mnt/src"
tar -C "$repo" --exclude=./target --exclude=./.git -cf - . | tar -C "$mnt/src" -xf -
mkdir "$mnt/log"
for i in $(seq 1 200); do
  printf 'record %04d\n' "$i" | dd of="$mnt/log/records" oflag=append conv=notrunc,fsync status=none
done
diff -r --exclude=target --exclude=.git "$repo" "$mnt/src" >/dev/null
echo "source tree read back identical to the original"
echo "files: $(find "$mnt" -type f | wc -l), bytes: $(du -sb "$mnt" | cut -f1), records: $(wc -l < "$mnt/log/records")"
echo "workload took $(( ($(date +%s%N) - start) / 1000000 )) ms"

echo "== umount (flushes everything; quill exits once the image is clean)"
umount "$mnt"
trap - EXIT
flock "$image" true   # waits for the quill process to finish and release the image

echo "== quill info $image"
"$quill" info "$image"

echo "== e2fsck -fn $image"
e2fsck -fn "$image"
echo "demo done: image and mount point in $work"
