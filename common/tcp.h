// TCP connections with deadlines, shared by the rendezvous (common/rendezvous.c) and the ranks of a
// build without NCCL (kernels/cpu/comm.c). IPv4; every socket here is non-blocking, and every wait
// ends at a deadline (wall_seconds() clock), so that a peer that died or hangs never blocks a rank.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Big-endian uint32, the integers of every message.
void tcp_put_u32(unsigned char* p, uint32_t v);
uint32_t tcp_get_u32(const unsigned char* p);

// What tcp_transfer returns when the deadline passed.
extern const char TCP_TIMED_OUT[];
// Sends (sending 1) or receives exactly n bytes before the deadline, however the kernel splits
// them. Returns NULL, TCP_TIMED_OUT, or what else went wrong ("the other end closed the connection",
// strerror). A peer that has gone away gives an error, not a SIGPIPE.
const char* tcp_transfer(int fd, void* buf, size_t n, int sending, double deadline);
// Waits until fd is ready for `events` (poll's) or has failed: 1, or 0 when the deadline passed.
int tcp_wait(int fd, short events, double deadline);
void tcp_set_nonblocking(int fd);
// A non-blocking socket listening on every interface at port (0: a free port the kernel picks),
// or -1 with errno set. A port left in TIME_WAIT by an earlier run is taken; one that a program
// listens on is not.
int tcp_listen(int port);
// The port a socket is bound to.
int tcp_port(int fd);
// One try to connect to host:port before the deadline: the non-blocking socket; -1 when the try
// failed in a way another try may not (refused, no answer, the name server did not answer); -2
// when host is not a name or address that resolves. Either way `why` says what happened.
int tcp_connect(const char* host, int port, double deadline, char* why, size_t size);
// Whether a connected socket is connected to itself. A connect to a port of this host on which
// nothing listens succeeds, rarely, when the kernel happens to pick that same port as the
// connection's source (TCP's simultaneous open): the port must be in the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range). tcp_connect counts such a try as refused: a rank would
// read its own hello as rank 0's reply.
int tcp_connected_to_itself(int fd);

#ifdef __cplusplus
}
#endif
