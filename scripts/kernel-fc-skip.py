#!/usr/bin/env python3
"""Shows the kernel's ext4 fast commit acknowledging an fsync that no commit carried.

    scripts/kernel-fc-skip.py [--trials N] [--keep] [WORKDIR]

Needs root, loop devices and e2fsprogs. Each trial: one thread appends 4 KiB to file `a` and
fsyncs it (a fast commit, a few milliseconds on a virtual disk); 200-400 us later the main
thread appends one byte to file `b` and fsyncs it. Both return; no thread is in the file system
any more. The loop device's backing file is then copied (a crash image of a quiet file system,
made as quill's tests make theirs) and the copy is recovered by the kernel's own mount: is `b` as
long as its fsync said?

Why it can fail (fs/ext4/fast_commit.c, `ext4_fc_commit`, still so in 6.18): the fsync of `b`
reads `s_fc_subtid`, finds `a`'s fast commit ongoing (`jbd2_fc_begin_commit` returns EALREADY
after waiting for it) and, since that fast commit moved `s_fc_subtid` when it ended, returns 0
(EXT4_FC_STATUS_SKIPPED) without asking whether it carried `b`. It did not when `b` changed after
it had taken its snapshot of the inodes to commit (handles go on during a fast commit since
"ext4: rework fast commit commit path", 2022). `b` waits in the queue for the next fast or full
commit, which a crash may never see. quill's fsync returns only once a fast commit carrying its
own records is durable (crates/fs/tests/fsync_journal.rs,
`an_fsync_during_another_files_fast_commit_returns_once_its_own_records_are_durable`).

With --keep, each losing crash image stays in WORKDIR (lost-N.img); `quill journal dump --blocks`
on one shows the fast commits it holds (none with b's size), and `quill recover`, `e2fsck -fy`
and the kernel all bring back the same shorter `b`.
"""
import argparse
import os
import subprocess
import tempfile
import threading
import time


def run(*args):
    subprocess.run(args, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the losing crash images")
    parser.add_argument("workdir", nargs="?")
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="kernel-fc-skip.")
    os.makedirs(work, exist_ok=True)
    image, mnt, replay = f"{work}/live.img", f"{work}/mnt", f"{work}/replay"
    os.makedirs(mnt, exist_ok=True)
    os.makedirs(replay, exist_ok=True)
    run("mkfs.ext4", "-q", "-F", "-O", "fast_commit", "-b", "4096", image, "1G")
    # A long commit interval: no timer commit turns the fast commits into a full one.
    run("mount", "-o", "loop,commit=600", image, mnt)
    lost = []
    try:
        fa = os.open(f"{mnt}/a", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        fb = os.open(f"{mnt}/b", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        os.write(fb, b"x" * 100)
        run("sync", "-f", mnt)
        acknowledged = 100
        for trial in range(args.trials):
            delay = (200 + 100 * (trial % 3)) / 1e6

            def append_a():
                os.write(fa, b"a" * 4096)
                os.fsync(fa)

            thread = threading.Thread(target=append_a)
            thread.start()
            time.sleep(delay)
            os.write(fb, b"y")
            os.fsync(fb)
            acknowledged += 1
            thread.join()
            time.sleep(0.05)
            crash = f"{work}/crash.img"
            run("cp", "--sparse=always", image, crash)
            replayed = f"{work}/replayed.img"
            run("cp", "--sparse=always", crash, replayed)
            run("mount", "-o", "loop", replayed, replay)
            got = os.stat(f"{replay}/b").st_size
            run("umount", replay)
            os.unlink(replayed)
            if got < acknowledged:
                lost.append((trial, int(delay * 1e6), acknowledged, got))
                if args.keep:
                    os.rename(crash, f"{work}/lost-{trial}.img")
            if os.path.exists(crash):
                os.unlink(crash)
        os.close(fa)
        os.close(fb)
    finally:
        subprocess.run(["umount", mnt])
    print(f"{args.trials} trials: b shorter than its acknowledged fsync after the kernel's "
          f"replay in {len(lost)}")
    for trial, delay, want, got in lost:
        print(f"  trial {trial} (b written {delay} us after a's fsync began): "
              f"fsync acknowledged {want} bytes, the crash image has {got}")
    if args.keep and lost:
        print(f"losing crash images kept in {work}")


if __name__ == "__main__":
    main()
