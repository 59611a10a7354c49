/*
 * rollbox-uds-listen PATH -- PROG ARGS...
 * rollbox-uds-listen --nproc N -- PROG ARGS...
 *
 * Binds and listens on the unix socket PATH, puts it on fd 3 and execs PROG (the rollbox
 * agent's `serve 3`). Used as the first process of a gVisor sandbox: a listening socket
 * made by the host cannot be handed into gVisor, so the socket is made inside, on a
 * directory bind-mounted from the host, and runsc's --host-uds=create makes it a real
 * host socket the host connects to.
 *
 * The --nproc form sets RLIMIT_NPROC=N and execs PROG (searched in PATH): each exec's
 * command runs under it, so a fork bomb inside is held by gVisor while the agent itself
 * (not limited) can still fork sessions for the next exec.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int run_limited(char **argv) {
    char *end = NULL;
    unsigned long n = strtoul(argv[2], &end, 10);
    if (!end || *end || strcmp(argv[3], "--") != 0 || !argv[4]) {
        fprintf(stderr, "usage: rollbox-uds-listen --nproc N -- PROG ARGS...\n");
        return 2;
    }
    struct rlimit rl = {n, n};
    if (setrlimit(RLIMIT_NPROC, &rl) != 0) {
        fprintf(stderr, "rollbox: setrlimit(RLIMIT_NPROC): %s\n", strerror(errno));
        return 125;
    }
    execvp(argv[4], argv + 4);
    int e = errno;
    fprintf(stderr, "rollbox: %s: %s\n", argv[4], strerror(e));
    return e == EACCES ? 126 : 127;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "--nproc") == 0) return run_limited(argv);
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: rollbox-uds-listen PATH -- PROG ARGS...\n");
        return 2;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(argv[1]) >= sizeof addr.sun_path) {
        fprintf(stderr, "rollbox-uds-listen: path too long: %s\n", argv[1]);
        return 2;
    }
    strcpy(addr.sun_path, argv[1]);
    unlink(argv[1]);
    umask(077);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0) {
        fprintf(stderr, "rollbox-uds-listen: %s: %s\n", argv[1], strerror(errno));
        return 125;
    }
    if (fd != 3) {
        if (dup2(fd, 3) < 0) return 125;
        close(fd);
    }
    umask(022);
    execv(argv[3], argv + 3);
    fprintf(stderr, "rollbox-uds-listen: exec %s: %s\n", argv[3], strerror(errno));
    return 127;
}
