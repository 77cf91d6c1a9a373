# shellcheck shell=bash
# Sourced by the tests whose ranks meet over TCP on 127.0.0.1 (tests/gpu/test_two_nodes.sh,
# tests/e2e/test_ranks_cpu.sh).

# A port that nothing on this host listens on, below the kernel's range for the source ports of
# outgoing connections (32768 by default), so that no connection (NCCL's among them) takes it
# meanwhile, and a rank's try to connect to it cannot connect to itself.
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 12000))
        (: < "/dev/tcp/127.0.0.1/$port") 2> /dev/null || { echo "$port"; return; }
    done
}
