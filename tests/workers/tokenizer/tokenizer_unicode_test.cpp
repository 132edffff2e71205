// tokenizer_unicode_test.cpp: UTF-8 decoding and NFC against the examples of UAX #15 and the
// Unicode Standard (chapter 3 tables), which define the expected results.
#include <gtest/gtest.h>

#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer::unicode {
namespace {

TEST(Utf8, DecodesWellFormedCharacters) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA4\x96";
  EXPECT_EQ(decode_utf8(s, 0).cp, 0x61u);
  EXPECT_EQ(decode_utf8(s, 1).cp, 0xE9u);
  EXPECT_EQ(decode_utf8(s, 3).cp, 0x20ACu);
  EXPECT_EQ(decode_utf8(s, 6).cp, 0x1F916u);
  EXPECT_EQ(decode_utf8(s, 6).len, 4u);
  EXPECT_TRUE(is_valid_utf8(s));
}

TEST(Utf8, IllFormedInputUsesMaximalSubparts) {
  // Unicode 14 §3.9, Table 3-8: "61 F1 80 80 E1 80 C2 62 80 63 80 BF 64" becomes
  // a, FFFD (F1 80 80), FFFD (E1 80), FFFD (C2), b, FFFD, c, FFFD, FFFD, d.
  const std::string s("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64");
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(to_valid_utf8_lossy(s), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_FALSE(is_valid_utf8(s));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(Nfc, ComposesReordersAndHandlesSingletons) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                       // e + U+0301 -> U+00E9
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                    // ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(nfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");  // UAX #15: d-dot-above + dot-below
  EXPECT_EQ(nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");      // no composite: only reordering
  EXPECT_EQ(nfc("\xCD\x84"), "\xCC\x88\xCC\x81");                // U+0344 is a composition exclusion
  EXPECT_EQ(nfc("\xC3\x85"), "\xC3\x85");                        // already NFC
}

TEST(Nfc, HangulSyllablesComposeAlgorithmically) {
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // U+1100 U+1161 -> U+AC00
  EXPECT_EQ(nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");  // U+AC00 + U+11A8 -> U+AC01
}

TEST(Nfc, BlockedMarksDoNotCompose) {
  // a + U+0305 (ccc 230, no composite) + U+0301 (230): the acute is blocked, nothing composes.
  EXPECT_EQ(nfc("a\xCC\x85\xCC\x81"), "a\xCC\x85\xCC\x81");
  // a + U+0323 (ccc 220) + U+0302 (230): U+1EA1 (a-dot-below) forms, then U+1EAD with U+0302.
  EXPECT_EQ(nfc("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");
}

TEST(Nfc, IllFormedBytesPassThrough) {
  EXPECT_EQ(nfc(std::string("\xFF" "e\xCC\x81\x80", 5)), std::string("\xFF\xC3\xA9\x80", 4));
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
}

TEST(WhiteSpace, MatchesTheUnicodeProperty) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x3000u}) {
    EXPECT_TRUE(is_white_space(cp)) << std::hex << cp;
  }
  for (uint32_t cp : {0x08u, 0x41u, 0x180Eu, 0x200Bu, 0xFEFFu}) EXPECT_FALSE(is_white_space(cp)) << std::hex << cp;
}

}  // namespace
}  // namespace tessera::tokenizer::unicode
