#include "common/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"

const char TCP_TIMED_OUT[] = "timed out";

void tcp_put_u32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

uint32_t tcp_get_u32(const unsigned char* p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int tcp_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - wall_seconds();
        int ms = left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        struct pollfd p = {fd, events, 0};
        int got = poll(&p, 1, ms);
        if (got > 0) return 1;
        if (got == 0) return 0;
        if (errno != EINTR) fatal("poll on a TCP connection: %s", strerror(errno));
    }
}

const char* tcp_transfer(int fd, void* buf, size_t n, int sending, double deadline) {
    char* p = buf;
    while (n > 0) {
        // MSG_NOSIGNAL: a peer that has gone away gives EPIPE, not a SIGPIPE that kills the process.
        ssize_t got = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (got > 0) {
            p += got;
            n -= (size_t)got;
        } else if (got == 0) {
            return "the other end closed the connection";
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!tcp_wait(fd, sending ? POLLOUT : POLLIN, deadline)) return TCP_TIMED_OUT;
        } else if (errno != EINTR) {
            return strerror(errno);
        }
    }
    return NULL;
}

void tcp_set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        fatal("cannot make a TCP socket non-blocking: %s", strerror(errno));
}

int tcp_listen(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr*)&any, sizeof any) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    tcp_set_nonblocking(fd);
    return fd;
}

int tcp_port(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr*)&a, &len) != 0) fatal("getsockname of a TCP socket: %s", strerror(errno));
    return ntohs(a.sin_port);
}

int tcp_connect(const char* host, int port, double deadline, char* why, size_t size) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *found;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int e = getaddrinfo(host, service, &hints, &found);
    if (e == EAI_AGAIN) { // the name server did not answer: it may yet
        snprintf(why, size, "cannot resolve %s: %s", host, gai_strerror(e));
        return -1;
    }
    if (e != 0) {
        snprintf(why, size, "%s", e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
        return -2;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) fatal("cannot create a TCP socket: %s", strerror(errno));
    tcp_set_nonblocking(fd);
    int rc = connect(fd, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
        if (!tcp_wait(fd, POLLOUT, deadline)) {
            snprintf(why, size, "no answer");
            close(fd);
            return -1;
        }
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err ? -1 : 0;
        errno = err;
    }
    if (rc != 0) {
        snprintf(why, size, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    if (tcp_connected_to_itself(fd)) {
        snprintf(why, size, "Connection refused (the try connected to itself: nothing listens on that port)");
        close(fd);
        return -1;
    }
    return fd;
}

int tcp_connected_to_itself(int fd) {
    struct sockaddr_in mine, peer;
    socklen_t mine_len = sizeof mine, peer_len = sizeof peer;
    if (getsockname(fd, (struct sockaddr*)&mine, &mine_len) != 0 ||
        getpeername(fd, (struct sockaddr*)&peer, &peer_len) != 0 || mine.sin_family != AF_INET)
        return 0;
    return mine.sin_port == peer.sin_port && mine.sin_addr.s_addr == peer.sin_addr.s_addr;
}
