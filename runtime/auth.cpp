// auth.cpp: Note [Agent authentication] primitives on OpenSSL's libcrypto.
#include "runtime/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace tessera::runtime {

Result<std::string> random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return make_error(ErrorCode::internal, "OpenSSL RAND_bytes failed");
  }
  return out;
}

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

std::string agent_proof(const std::string& token, const std::string& driver_nonce,
                        const std::string& agent_nonce) {
  return hmac_sha256(token, "tessera-agent|" + driver_nonce + "|" + agent_nonce);
}

std::string driver_proof(const std::string& token, const std::string& agent_nonce,
                         const std::string& driver_nonce) {
  return hmac_sha256(token, "tessera-driver|" + agent_nonce + "|" + driver_nonce);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tessera::runtime
