// HMAC-SHA256 against RFC 4231 test vectors, and the challenge-response proofs.
#include <gtest/gtest.h>

#include "runtime/auth.hpp"

namespace tessera::runtime {
namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(Auth, HmacSha256MatchesRfc4231) {
  // Test case 1: key = 0x0b * 20, data = "Hi There".
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: key = "Jefe", data = "what do ya want for nothing?".
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Auth, ProofsBindBothNoncesAndTheRole) {
  std::string token = "0123456789abcdef-secret";
  std::string nd = *random_bytes(32);
  std::string na = *random_bytes(32);
  EXPECT_EQ(nd.size(), 32u);
  EXPECT_NE(nd, na);
  std::string pa = agent_proof(token, nd, na);
  std::string pd = driver_proof(token, na, nd);
  EXPECT_NE(pa, pd);  // a reflected proof is useless
  EXPECT_TRUE(constant_time_equal(pa, agent_proof(token, nd, na)));
  EXPECT_FALSE(constant_time_equal(pa, agent_proof(token + "x", nd, na)));
  EXPECT_FALSE(constant_time_equal(pd, driver_proof(token, na, *random_bytes(32))));
  EXPECT_FALSE(constant_time_equal(pa, pa.substr(1)));
}

}  // namespace
}  // namespace tessera::runtime
