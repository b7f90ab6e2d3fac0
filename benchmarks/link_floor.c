/* The transfers of benchmarks/link_floor.py, in C: no interpreter between the syscalls.
 *
 *   link_floor serve ADDR SOCKBUF CHUNK ITERS WARMUP ROUNDS SIZE...        host b: prints its port
 *   link_floor lead ADDR PORT SOCKBUF CHUNK ITERS WARMUP ROUNDS SIZE...    host a: prints the times
 *
 * One TCP connection (TCP_NODELAY, SO_SNDBUF/SO_RCVBUF of SOCKBUF unless 0), non-blocking:
 * send() and recv() of at most CHUNK bytes each (0: no cap) with MSG_DONTWAIT, poll() only
 * when neither direction can move, as ndist's TCP engine does. For each SIZE, two patterns:
 * "one way" (a sends SIZE bytes, ITERS times back to back; b answers one byte once all are
 * in) and "both ways" (a and b each send SIZE bytes ITERS times, taking in the other's as
 * they come). A round starts with a one-byte token from a, so a loop of calls is timed as a
 * library's loop is: the sender may run ahead of the receiver by what the sockets buffer.
 * The leader prints, per size and pattern, one line: SIZE BOTH US_ROUND1 US_ROUND2 ...
 * (µs per transfer of each round). */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(2);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static size_t chunk = (size_t)-1; /* the most one send() or recv() moves */

static size_t capped(size_t n) {
    return n < chunk ? n : chunk;
}

/* send all of out[0:nout] and take in all of in[0:nin], whichever can move */
static void xfer(int fd, const char *out, size_t nout, char *in, size_t nin) {
    size_t sent = 0, got = 0;
    while (sent < nout || got < nin) {
        int moved = 0;
        if (sent < nout) {
            ssize_t w = send(fd, out + sent, capped(nout - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                sent += (size_t)w;
                moved = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                die("send");
            }
        }
        if (got < nin) {
            ssize_t r = recv(fd, in + got, capped(nin - got), MSG_DONTWAIT);
            if (r == 0) {
                fprintf(stderr, "link_floor: the peer closed the connection\n");
                exit(2);
            }
            if (r > 0) {
                got += (size_t)r;
                moved = 1;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                die("recv");
            }
        }
        if (!moved) {
            struct pollfd p = {fd, (short)((sent < nout ? POLLOUT : 0) | (got < nin ? POLLIN : 0)), 0};
            if (poll(&p, 1, -1) < 0 && errno != EINTR)
                die("poll");
        }
    }
}

/* one round: the token, `iters` transfers of n bytes, and for one way b's answer */
static void round_(int fd, const char *out, char *in, size_t n, int iters, int both, int leader) {
    char token = 'g';
    if (leader)
        xfer(fd, &token, 1, NULL, 0);
    else
        xfer(fd, NULL, 0, &token, 1);
    for (int i = 0; i < iters; i++) {
        if (both)
            xfer(fd, out, n, in, n);
        else if (leader)
            xfer(fd, out, n, NULL, 0);
        else
            xfer(fd, NULL, 0, in, n);
    }
    if (!both) {
        if (leader)
            xfer(fd, NULL, 0, &token, 1); /* b's answer: every byte is in */
        else
            xfer(fd, &token, 1, NULL, 0);
    }
}

static void tune(int fd, int sockbuf) {
    int one_ = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one_, sizeof one_);
    if (sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
    }
}

int main(int argc, char **argv) {
    int leader = argc > 1 && strcmp(argv[1], "lead") == 0;
    int first = leader ? 9 : 8; /* the first SIZE */
    if (argc <= first || (!leader && strcmp(argv[1], "serve") != 0)) {
        fprintf(stderr, "usage: link_floor serve ADDR SOCKBUF CHUNK ITERS WARMUP ROUNDS SIZE... | "
                        "lead ADDR PORT SOCKBUF CHUNK ITERS WARMUP ROUNDS SIZE...\n");
        return 2;
    }
    int k = leader ? 4 : 3;
    int sockbuf = atoi(argv[k]), iters = atoi(argv[k + 2]), warmup = atoi(argv[k + 3]), rounds = atoi(argv[k + 4]);
    if (strtoull(argv[k + 1], NULL, 10) > 0)
        chunk = (size_t)strtoull(argv[k + 1], NULL, 10);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
        fprintf(stderr, "link_floor: bad address %s\n", argv[2]);
        return 2;
    }
    int fd;
    if (leader) {
        sa.sin_port = htons((unsigned short)atoi(argv[3]));
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
            die("connect");
    } else {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        socklen_t len = sizeof sa;
        if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0 ||
            getsockname(ls, (struct sockaddr *)&sa, &len) != 0)
            die("listen");
        printf("%d\n", ntohs(sa.sin_port));
        fflush(stdout);
        fd = accept(ls, NULL, NULL);
        if (fd < 0)
            die("accept");
        close(ls);
    }
    tune(fd, sockbuf);
    for (int s = first; s < argc; s++) {
        size_t n = (size_t)strtoull(argv[s], NULL, 10);
        char *out = malloc(n ? n : 1), *in = malloc(n ? n : 1);
        if (!out || !in)
            die("malloc");
        memset(out, 1, n);
        memset(in, 0, n);
        for (int both = 0; both < 2; both++) {
            if (warmup > 0)
                round_(fd, out, in, n, warmup, both, leader);
            if (leader)
                printf("%zu %d", n, both);
            for (int r = 0; r < rounds; r++) {
                double t0 = now_us();
                round_(fd, out, in, n, iters, both, leader);
                if (leader)
                    printf(" %.2f", (now_us() - t0) / iters);
            }
            if (leader)
                printf("\n");
            if (both && n && (in[0] != 1 || in[n - 1] != 1)) {
                fprintf(stderr, "link_floor: wrong bytes received (%zu both ways)\n", n);
                return 2;
            }
        }
        free(out);
        free(in);
    }
    close(fd);
    return 0;
}
