// free_port.hpp (tessera::proto): a TCP port for a listener that is started later by someone else
// (a rendezvous store, a test's server).
//
// Note [Ports outside the ephemeral range]
// The usual trick, bind to port 0, read the port the kernel chose and close, returns a port from
// the ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 on Linux), the range the kernel
// also takes the local port of every outgoing connection from. Between the pick and the
// listener's bind any connect() on the machine may take that port, and the listener fails with
// EADDRINUSE (a test run with many short connections beside it hit this). A port picked at random
// outside that range can only be taken by another listener in that window. The ports picked lie
// between 10000 and the start of the ephemeral range (10000-32767 by default), or above its end
// when that leaves fewer than 1000, or anywhere from 10000 when neither span is that wide.
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "proto/status.hpp"

namespace tessera::proto {

/// A TCP port that nothing is bound to on `host` (an IPv4 address) now, picked at random outside
/// the kernel's ephemeral range (Note [Ports outside the ephemeral range]); this process is never
/// given the same port twice. Fails with `unavailable` when 200 tries find none.
Result<uint16_t> pick_free_port(const std::string& host = "0.0.0.0");

}  // namespace tessera::proto
