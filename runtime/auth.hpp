// auth.hpp: the shared-secret challenge-response between a driver and an agent.
//
// Note [Agent authentication]
// Both sides hold the same token (a file readable only by its owner). No secret crosses the
// wire; each side proves knowledge of it with HMAC-SHA256 over fresh random nonces:
//   driver -> agent   (hello_atom, Nd)                       Nd: 32 random bytes
//   agent  -> driver  (Na, HMAC(token, "tessera-agent|" Nd "|" Na))
//   driver            checks the agent's proof (mutual authentication)
//   driver -> agent   (auth_atom, HMAC(token, "tessera-driver|" Na "|" Nd), hub)
//   agent             checks it in constant time; the driver's node is now authenticated
// The agent refuses every other request from a node that has not completed this exchange.
// Nonces are single-use: a second auth_atom for the same challenge is refused.
#pragma once

#include <string>

#include "proto/status.hpp"

namespace tessera::runtime {

/// `n` cryptographically random bytes (OpenSSL RAND_bytes). Error if the RNG fails.
Result<std::string> random_bytes(size_t n);

/// HMAC-SHA256(key, message), 32 raw bytes.
std::string hmac_sha256(const std::string& key, const std::string& message);

/// The agent's proof for (driver nonce, agent nonce).
std::string agent_proof(const std::string& token, const std::string& driver_nonce,
                        const std::string& agent_nonce);
/// The driver's proof for (agent nonce, driver nonce).
std::string driver_proof(const std::string& token, const std::string& agent_nonce,
                         const std::string& driver_nonce);

/// Constant-time equality of two byte strings (length leaks, contents do not).
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace tessera::runtime
