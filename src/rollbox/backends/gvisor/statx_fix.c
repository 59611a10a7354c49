/*
 * LD_PRELOAD shim for gVisor 20221219: its statx() rejects AT_NO_AUTOMOUNT with EINVAL,
 * which breaks `ls` and `stat` of current coreutils inside the sandbox. Automounts do not
 * exist inside gVisor, so dropping the flag changes nothing else.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
