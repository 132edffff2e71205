// unicode_tables.hpp: raw Unicode Character Database data behind NFC (see unicode.hpp).
// Private to workers/models: only unicode.cpp reads these tables.
//
// Note [NFC tables]
// NFC needs three facts per code point: its canonical combining class, its one-level canonical
// decomposition, and whether that decomposition recombines (a "primary composite", i.e. not in
// the full composition exclusion set). unicode_tables.cpp holds them, generated from Python's
// `unicodedata` (Unicode 14.0, the same version as Debian 12's PCRE2 10.42, so regex classes
// and normalisation agree). Hangul syllables are algorithmic and left out. Regenerate with:
//
//   import unicodedata as u
//   runs of (first, last, u.combining(chr(cp))) for every cp with a non-zero class;
//   for every cp outside U+AC00..U+D7A3 whose u.decomposition() is canonical (no "<tag>"):
//     (cp, first, second or 0, composes = two parts and u.normalize('NFC', chr(cp)) == chr(cp))
//
// printed as the brace lists below, sorted by code point.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::tokenizer::unicode_tables {

/// Code points first..last (inclusive) all have canonical combining class `ccc` (non-zero).
struct CombiningClassRun {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
};

/// `cp` canonically decomposes (one level) to `first` [+ `second` when non-zero].
struct CanonicalDecomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
  uint8_t composes;  ///< 1 when `first`+`second` recompose to `cp` under NFC.
};

/// The Unicode version the tables were generated from ("14.0.0").
extern const char kUnicodeVersion[];
/// Sorted by `first`, non-overlapping.
extern const CombiningClassRun kCombiningClassRuns[];
extern const size_t kCombiningClassRunCount;
/// Sorted by `cp`.
extern const CanonicalDecomposition kCanonicalDecompositions[];
extern const size_t kCanonicalDecompositionCount;

}  // namespace tessera::tokenizer::unicode_tables
