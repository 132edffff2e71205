// reward_math.hpp: native ports of verl v0.5.0's rule scorers for MATH, math_dapo / AIME and
// Search-R1 QA (verl/utils/reward_score/{math,math_dapo,search_r1_like_qa_em}.py), as chosen by
// verl's default_compute_score. The results equal verl's: text is UTF-8 and everything Python does
// per code point (slices, str.lower/strip/split/isdigit, re's \s, \w, \b, '.' and IGNORECASE) is
// done per code point with utf8proc's character data, which differs from CPython 3.11's for a few
// characters (superscript and circled digits, U+0130, Unicode 15; see Note [Python strings in
// UTF-8] in reward_math.cpp). Bytes that are not UTF-8 count as one character each (Python never
// sees them).
//
// verl's geo3k scorer ("hiyouga/geometry3k") is not ported: it needs the mathruler package.
//
// Pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tessera::driver {

// ---- verl/utils/reward_score/math.py (lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
// HuggingFaceH4/MATH-500).

/// math.last_boxed_only_string: the last "\boxed{...}" / "\fbox{...}" with balanced braces, or,
/// when the text holds "\boxed " anywhere, "\boxed " plus what follows the last one up to a '$'.
std::optional<std::string> math_last_boxed_only_string(std::string_view s);
/// math.remove_boxed; nullopt where verl's assertions fail (e.g. an "\fbox{...}").
std::optional<std::string> math_remove_boxed(std::string_view s);
/// math.strip_string (fix_sqrt, fix_fracs, fix_a_slash_b, remove_right_units, ...); nullopt
/// where verl raises (a trailing "\frac" or "\sqrt", two "\text{ " units).
std::optional<std::string> math_strip_string(std::string_view s);
/// math.is_equiv: strip_string on both sides, or plain equality when either raises.
bool math_is_equiv(std::string_view a, std::string_view b);
/// math.compute_score: 1.0 when the last boxed answer is_equiv the ground truth, else 0.0.
double math_compute_score(std::string_view solution, std::string_view ground_truth);

// ---- verl/utils/reward_score/math_dapo.py ("math_dapo" and data sources starting with "aime").

/// math_dapo.normalize_final_answer (Minerva's normalisation).
std::string math_dapo_normalize_final_answer(std::string_view answer);
/// math_dapo.compute_score with verl's defaults (strict_box_verify=False,
/// pause_tokens_index=None): {"score": 1.0 | -1.0, "acc": bool, "pred": string}. The answer is
/// the last "Answer: ..." line (case-insensitive) of the final 300 characters, "[INVALID]" when
/// there is none; it is correct when its normalisation equals the ground truth's.
/// With strict_box_verify, the answer is the last \boxed{...} of the final 100 characters (before
/// pause_tokens_index[-1], when given: pass that last index) compared verbatim; "pred" is null
/// when there is none.
nlohmann::json math_dapo_compute_score(std::string_view solution, std::string_view ground_truth,
                                       bool strict_box_verify = false,
                                       std::optional<long long> pause_tokens_last_index = std::nullopt);

// ---- verl/utils/reward_score/search_r1_like_qa_em.py (searchR1_nq, _triviaqa, _popqa, _hotpotqa,
// _2wikimultihopqa, _musique, _bamboogle).

/// search_r1_like_qa_em.normalize_answer: lower case, ASCII punctuation removed, the words
/// a/an/the removed, whitespace runs collapsed to one space.
std::string search_r1_normalize_answer(std::string_view s);
/// search_r1_like_qa_em.extract_solution: the stripped text of the last <answer>...</answer>.
std::optional<std::string> search_r1_extract_solution(std::string_view solution);
/// search_r1_like_qa_em.compute_score (method "strict"): 0 without an <answer>; `score` when the
/// normalised answer equals a normalised ground_truth["target"] (a string or a list of strings),
/// score / 4 when the text holds more than 10 <answer> or </answer> tags; else `format_score`.
/// nullopt where verl raises: an answer was found but ground_truth has no "target" or a target
/// compared is not a string.
std::optional<double> search_r1_compute_score(std::string_view solution, const nlohmann::json& ground_truth,
                                              double format_score = 0.0, double score = 1.0);

}  // namespace tessera::driver
